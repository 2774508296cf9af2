"""A demo consumer process: per consumer group, a broker_sim ``PushConsumer`` whose listener calls that
group's ``@idempotent_consumer`` handler (the ledger group moves money, an audit group writes its audit row).

Run as a process by the demo (``python -m reliable.demo.worker '<json config>'``) so that the chaos faults
are real: SIGKILL leaves a Redis lease, an uncommitted offset and an open transaction behind, exactly as a
crashed production consumer would — for every group at once, as when a service that consumes a topic in
several groups dies. The same :class:`Worker` class runs on a thread in the in-process fallback mode.

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
from dataclasses import dataclass
from types import FrameType
from typing import Any

from reliable.adapters.broker_sim import GuardedListener, send_back_to_dlq
from reliable.demo import groups, parts
from reliable.demo.services import SIG_DROP_DB, SIG_LOSE_COMMITS, WorkerConfig, on_orphaned
from reliable.demo.transport import ChaosTransport
from reliable.facade import Reliability

log = logging.getLogger("reliable.demo.worker")

#: how long SIGUSR2 makes this worker's offset commits vanish
LOST_COMMIT_WINDOW_S = 4.0


@dataclass
class GroupConsumer:
    """One group's share of a worker: its guarded listener and its push consumer (with its own transport,
    which the consumer closes on shutdown)."""

    group: str
    transport: ChaosTransport
    listener: GuardedListener
    consumer: Any


class Worker:
    """One consumer of every demo group: per group a guard + its handler + a broker_sim push consumer."""

    def __init__(self, config: WorkerConfig, broker: Any | None = None) -> None:
        self.config = config
        self.rel = Reliability(config.db_url, config.redis_url, **config.settings)
        target = broker if broker is not None else config.address
        self.members = [self._member(group, target) for group in config.groups]

    def _member(self, group: str, target: Any) -> GroupConsumer:
        handler = parts.guard(self.rel, group, groups.business_handler(group, self.config.name))
        transport = ChaosTransport.wrap(target)
        # the group names the delivered topic of %RETRY% deliveries (retries and targeted resends)
        listener = GuardedListener(handler, send_back_to_dlq(transport.as_transport(), group), group=group)
        consumer = parts.push_consumer(transport.as_transport(), group, dict(self.config.consumer_options))
        consumer.subscribe(self.config.topic, "*", listener)
        return GroupConsumer(group, transport, listener, consumer)

    def start(self) -> None:
        for m in self.members:
            m.consumer.start()
        log.info(
            "worker %s consuming %s as %s", self.config.name, self.config.topic, ", ".join(self.config.groups)
        )

    def stop(self) -> None:
        """Clean stop: offsets persisted, clients unregistered, connections closed."""
        try:
            for m in self.members:
                m.consumer.shutdown()
        finally:
            self.rel.close()

    def kill(self) -> None:
        """Thread-mode SIGKILL: the consumers stop without persisting offsets (leases stay in Redis)."""
        for m in self.members:
            kill = getattr(m.consumer, "kill", None)
            if kill is None:
                m.consumer.shutdown()
            else:
                kill()

    def drop_db_connections(self) -> None:
        self.rel.engine.dispose()

    def lose_offset_commits(self, seconds: float = LOST_COMMIT_WINDOW_S) -> None:
        for m in self.members:
            m.transport.lose_offset_commits(seconds)


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
    started: list[Worker] = []  # the chaos signals act on the worker once it is built

    def on_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    def on_drop_db(signum: int, frame: FrameType | None) -> None:
        # not in the handler itself: dispose() takes pool locks a signal may have interrupted
        for w in started:
            threading.Thread(target=w.drop_db_connections, daemon=True).start()

    def on_lose_commits(signum: int, frame: FrameType | None) -> None:
        for w in started:
            w.lose_offset_commits()

    # installed before the worker is built (its imports and connections take a second or more): a chaos
    # signal to a worker still starting killed it (SIGUSR1/2's default action), counted as a crash at
    # start-up, while the fault log said "connections dropped"
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(SIG_DROP_DB, on_drop_db)
    signal.signal(SIG_LOSE_COMMITS, on_lose_commits)
    worker = Worker(config)
    started.append(worker)
    on_orphaned(stop.set)
    worker.start()
    while not stop.wait(1.0):
        pass
    worker.stop()
    for m in worker.members:
        stats = m.listener.stats
        log.warning(
            "worker %s (%s) stopped: delivered=%d success=%d later=%d dead=%d",
            config.name,
            m.group,
            stats.delivered,
            stats.success,
            stats.reconsume_later,
            stats.dead_lettered,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
