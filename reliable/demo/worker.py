"""A demo consumer: a broker_sim ``PushConsumer`` whose listener calls the ``@idempotent_consumer`` handler.

Run as a process by the demo (``python -m reliable.demo.worker '<json config>'``) so that the chaos faults
are real: SIGKILL leaves a Redis lease, an uncommitted offset and an open transaction behind, exactly as a
crashed production consumer would. The same :class:`Worker` class runs on a thread in the in-process
fallback mode.

Signals (installed only when run as a process):

* SIGTERM / SIGINT — clean stop: the consumer persists its offsets and unregisters;
* SIGUSR1 — drop every pooled database connection (``engine.dispose()``), the SQLite form of
  "database connection drop";
* SIGUSR2 — lose this worker's offset commits for the next few seconds.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType
from typing import Any

from reliable.adapters.broker_sim import GuardedListener, send_back_to_dlq
from reliable.demo import ledger, parts
from reliable.demo.services import SIG_DROP_DB, SIG_LOSE_COMMITS, WorkerConfig, on_orphaned
from reliable.demo.transport import ChaosTransport
from reliable.facade import Reliability

log = logging.getLogger("reliable.demo.worker")

#: how long SIGUSR2 makes this worker's offset commits vanish
LOST_COMMIT_WINDOW_S = 4.0


class Worker:
    """One consumer of the demo group: guard + ledger handler + broker_sim push consumer."""

    def __init__(self, config: WorkerConfig, broker: Any | None = None) -> None:
        self.config = config
        self.rel = Reliability(config.db_url, config.redis_url, **config.settings)
        handler = parts.guard(self.rel, config.group, ledger.make_business_handler(config.name))
        self.transport = ChaosTransport.wrap(broker if broker is not None else config.address)
        self.listener = GuardedListener(
            handler, send_back_to_dlq(self.transport.as_transport(), config.group)
        )
        self.consumer = parts.push_consumer(
            self.transport.as_transport(), config.group, dict(config.consumer_options)
        )
        self.consumer.subscribe(config.topic, "*", self.listener)

    def start(self) -> None:
        self.consumer.start()
        log.info("worker %s consuming %s as %s", self.config.name, self.config.topic, self.config.group)

    def stop(self) -> None:
        """Clean stop: offsets persisted, client unregistered, connections closed."""
        try:
            self.consumer.shutdown()
        finally:
            self.rel.close()

    def kill(self) -> None:
        """Thread-mode SIGKILL: the consumer stops without persisting offsets (leases stay in Redis)."""
        kill = getattr(self.consumer, "kill", None)
        if kill is None:
            self.consumer.shutdown()
        else:
            kill()

    def drop_db_connections(self) -> None:
        self.rel.engine.dispose()

    def lose_offset_commits(self, seconds: float = LOST_COMMIT_WINDOW_S) -> None:
        self.transport.lose_offset_commits(seconds)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m reliable.demo.worker '<json config>'", file=sys.stderr)
        return 2
    config = WorkerConfig.from_json(args[0])
    logging.basicConfig(
        level=logging.WARNING, format=f"%(asctime)s {config.name} %(levelname)s %(name)s %(message)s"
    )
    stop = threading.Event()
    worker = Worker(config)

    def on_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    def on_drop_db(signum: int, frame: FrameType | None) -> None:
        # not in the handler itself: dispose() takes pool locks a signal may have interrupted
        threading.Thread(target=worker.drop_db_connections, daemon=True).start()

    def on_lose_commits(signum: int, frame: FrameType | None) -> None:
        worker.lose_offset_commits()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(SIG_DROP_DB, on_drop_db)
    signal.signal(SIG_LOSE_COMMITS, on_lose_commits)
    on_orphaned(stop.set)
    worker.start()
    while not stop.wait(1.0):
        pass
    worker.stop()
    stats = worker.listener.stats
    log.warning(
        "worker %s stopped: delivered=%d success=%d later=%d dead=%d",
        config.name,
        stats.delivered,
        stats.success,
        stats.reconsume_later,
        stats.dead_lettered,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
