"""The demo's broker process: ``broker-sim serve`` plus a power-cut signal.

``kill -9`` of a broker process loses nothing that was written: the commit log is memory-mapped, and the
page cache outlives the process (real RocketMQ behaves the same; only a machine crash loses what was not
flushed under ASYNC_FLUSH). To make the chaos broker crash the one that *loses messages*, this host runs the
same server class as ``broker-sim serve`` (:class:`broker_sim.remoting.serve.BrokerSimServer`, same
flags for the options the demo uses) and adds one thing: on SIGUSR1 it calls the broker's own fault
injector (``broker.faults.crash_broker``), which discards every commit-log and consume-queue byte not yet
flushed, and exits at once with status 137, as if the machine had lost power. The restart then runs the
store's crash recovery.

Run: ``python -m reliable.demo.broker_host --store DIR --namesrv-port P --broker-port Q [--set K=V ...]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

POWER_CUT = signal.SIGUSR1
POWER_CUT_EXIT = 137

log = logging.getLogger("reliable.demo.broker_host")


def _value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m reliable.demo.broker_host")
    p.add_argument("--store", required=True, type=Path)
    p.add_argument("--namesrv-port", type=int, required=True)
    p.add_argument("--broker-port", type=int, required=True)
    p.add_argument("--flush", choices=["SYNC_FLUSH", "ASYNC_FLUSH"], default="ASYNC_FLUSH")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from broker_sim.remoting.serve import BrokerSimServer, ServeConfig
    from reliable.demo.services import on_orphaned

    args = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s broker %(levelname)s %(name)s %(message)s")
    config: dict[str, Any] = {"flush_disk_type": args.flush}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"broker_host: --set expects KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        config[key] = _value(value)
    server = BrokerSimServer(
        ServeConfig(
            store_dir=args.store,
            namesrv_port=args.namesrv_port,
            broker_port=args.broker_port,
            broker_config=config,
        )
    )

    def power_cut(signum: int, frame: FrameType | None) -> None:
        broker = server.broker
        if broker is not None:
            broker.faults.crash_broker(broker)
        os._exit(POWER_CUT_EXIT)

    signal.signal(POWER_CUT, power_cut)
    on_orphaned(lambda: os.kill(os.getpid(), signal.SIGTERM))  # serve_forever stops cleanly on SIGTERM
    server.start()
    print(f"broker-sim ready namesrv={server.namesrv_address} broker={server.broker_address}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
