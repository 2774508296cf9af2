"""``broker-sim``: run the simulator as a network server, and administer it like ``mqadmin``.

    broker-sim serve --store DIR [--namesrv-port 9876] [--broker-port 10911] [--flush SYNC_FLUSH] ...
    broker-sim admin [--namesrv HOST:PORT] topic create|list|route ...
    broker-sim admin consumer progress GROUP
    broker-sim admin message query --topic T --key K | message view --id ID
    broker-sim admin dlq list [--group G]

Errors are one line on stderr with exit status 1 (bad arguments: argparse's usage line, status 2); no
tracebacks, because these commands are used from shell scripts and CI logs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker_sim.errors import BrokerSimError

DEFAULT_NAMESRV = "127.0.0.1:9876"


def _config_value(raw: str) -> Any:
    """``--set key=value`` values: JSON when it parses (numbers, booleans), else the string."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="broker-sim", description="A file-backed broker that behaves like RocketMQ 4.x."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser(
        "serve",
        help="run a name server and a broker over one store directory",
        description="Run a name server and a broker (RocketMQ remoting protocol) in one process.",
    )
    s.add_argument("--store", required=True, type=Path, help="store directory (created if missing)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    s.add_argument("--namesrv-port", type=int, default=9876, help="name server port (0: any free port)")
    s.add_argument("--broker-port", type=int, default=10911, help="broker port (0: any free port)")
    s.add_argument("--broker-name", default="broker-a")
    s.add_argument(
        "--grpc-port",
        type=int,
        help="also serve RocketMQ 5.x gRPC (MessagingService) on this port (0: any free port); needs grpcio "
        "and the protocol modules of rocketmq-python-client (see BROKER_SIM_RMQ5_PROTOCOL)",
    )
    s.add_argument(
        "--grpc-group",
        action="append",
        default=[],
        metavar="NAME:OPTIONS",
        help="5.x consumer group policy, e.g. 'orders:fifo,max_attempts=3,backoff=1s;5s' (repeatable)",
    )
    s.add_argument("--flush", choices=["SYNC_FLUSH", "ASYNC_FLUSH"], help="flush mode of the commit log")
    s.add_argument(
        "--auto-create-topics", action="store_true", help="create unknown topics on first send (TBW102)"
    )
    s.add_argument(
        "--acl",
        default=os.environ.get("BROKER_SIM_ACL", ""),
        metavar="AK:SK[,AK:SK]",
        help="enable the ACL check with these access keys (env BROKER_SIM_ACL)",
    )
    s.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other Broker option, e.g. --set max_reconsume_times=2 (repeatable)",
    )
    s.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    s.add_argument(
        "--fault-signals",
        action="store_true",
        help="test harnesses only: SIGUSR1 simulates a power cut (unflushed ASYNC_FLUSH data is lost, the "
        "abort file stays, exit status 137; the next start runs crash recovery)",
    )
    s.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop cleanly (as on SIGTERM) when the process that started this one exits",
    )

    a = sub.add_parser(
        "admin",
        help="administer a running broker-sim (like mqadmin)",
        description="Administer a running broker-sim over the network.",
    )
    a.add_argument(
        "--namesrv",
        default=os.environ.get("BROKER_SIM_NAMESRV", DEFAULT_NAMESRV),
        help=f"name server address (env BROKER_SIM_NAMESRV, default {DEFAULT_NAMESRV})",
    )
    a.add_argument("--json", action="store_true", help="print JSON instead of a table")
    asub = a.add_subparsers(dest="area", required=True, metavar="AREA")

    topic = asub.add_parser("topic", help="create, list and route topics").add_subparsers(
        dest="action", required=True
    )
    tc = topic.add_parser("create", help="create or update a topic")
    tc.add_argument("name")
    tc.add_argument("--queues", type=int, default=4, help="read and write queue count (default 4)")
    tc.add_argument("--perm", type=int, default=6, help="permission bits: 2 write, 4 read (default 6)")
    topic.add_parser("list", help="list topics")
    tr = topic.add_parser("route", help="show a topic's route")
    tr.add_argument("name")

    consumer = asub.add_parser("consumer", help="consumer groups").add_subparsers(
        dest="action", required=True
    )
    cp = consumer.add_parser("progress", help="per queue: broker offset, consumer offset, lag")
    cp.add_argument("group")
    cp.add_argument("--topic", help="only this topic")

    message = asub.add_parser("message", help="find messages").add_subparsers(dest="action", required=True)
    mq = message.add_parser("query", help="messages of a topic by key (index lookup)")
    mq.add_argument("--topic", required=True)
    mq.add_argument("--key", required=True)
    mq.add_argument("--max", type=int, default=32)
    mv = message.add_parser("view", help="one message by its broker message id (offsetMsgId)")
    mv.add_argument("--id", required=True)

    dlq = asub.add_parser("dlq", help="dead-letter queues").add_subparsers(dest="action", required=True)
    dl = dlq.add_parser("list", help="dead-lettered messages per group")
    dl.add_argument("--group", help="only this consumer group")
    dl.add_argument("--max", type=int, default=50, help="messages shown per group (default 50)")
    return p


def _serve(args: argparse.Namespace) -> int:
    from broker_sim.broker.config import split_config
    from broker_sim.remoting.acl import parse_accounts
    from broker_sim.remoting.serve import BrokerSimServer, ServeConfig

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    config: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        config[key.replace("-", "_")] = _config_value(value)
    if args.flush:
        config["flush_disk_type"] = args.flush
    if args.auto_create_topics:
        config["auto_create_topic_enable"] = True
    split_config(dict(config))  # reject unknown or malformed options before any port is bound
    from broker_sim.grpc.policy import GroupPolicy

    grpc_groups = dict(GroupPolicy.parse(spec) for spec in args.grpc_group)
    if args.grpc_port is not None:
        from broker_sim.grpc.protocol import load_protocol

        load_protocol()  # a missing protocol module is a one-line error before any port is bound
    server = BrokerSimServer(
        ServeConfig(
            store_dir=args.store,
            host=args.host,
            namesrv_port=args.namesrv_port,
            broker_port=args.broker_port,
            broker_name=args.broker_name,
            acl_accounts=parse_accounts(args.acl),
            broker_config=config,
            fault_signals=args.fault_signals,
            exit_with_parent=args.exit_with_parent,
            grpc_port=args.grpc_port,
            grpc_groups=grpc_groups,
        )
    )
    server.install_stop_signals()  # before start(): a SIGTERM right after the ports open still stops cleanly
    server.start()
    # One machine-readable line on stdout, so scripts and tests using port 0 learn the addresses.
    grpc = f" grpc={server.grpc.address}" if server.grpc is not None else ""
    print(
        f"broker-sim ready namesrv={server.namesrv_address} broker={server.broker_address}{grpc}", flush=True
    )
    server.serve_forever()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        from broker_sim.remoting.admin_cli import run_admin

        return run_admin(args)
    except KeyboardInterrupt:
        return 130
    except (BrokerSimError, OSError, ValueError) as exc:
        print(f"broker-sim: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
