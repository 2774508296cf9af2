"""The Kafka demo's consumers: guarded consumer threads, each able to carry one of the chaos faults.

Every consumer group of the demo reads :data:`TOPIC` with ``--consumers`` threads, each running one
:class:`ChaosConsumer` (a :class:`~reliable.adapters.kafka.KafkaGuardedConsumer` behind
``@idempotent_consumer``); the faults of :mod:`reliable.demo.kafka_faults` flip its switches.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import TopicPartition

from reliable import idempotent_consumer
from reliable.adapters.kafka import KafkaGuardedConsumer, RetryPolicy
from reliable.demo import groups as demo_groups
from reliable.demo.errors import DemoError
from reliable.demo.tansu import FAST_GROUP
from reliable.facade import Reliability

log = logging.getLogger("reliable.demo.kafka")

TOPIC = "demo_transfers"
PARTITIONS = 3


class ChaosConsumer(KafkaGuardedConsumer):
    """A consumer that can lose its offset commits or crash between its guard commit and its offset commit."""

    drop_commits = False
    crash_before_commit = False
    crashed = False
    #: a stalled consumer neither polls nor fetches (a slow or stuck service): records pile up on the broker
    stalled = False
    #: set once a stalled consumer is out of the poll it was in (that poll may still have handled records)
    parked = False

    def poll_once(self) -> int:
        if self.stalled:
            if not self.parked:
                # not polling is not enough: librdkafka keeps fetching into its local queue in the background,
                # and records it already holds would survive the broker losing them. Paused partitions fetch
                # nothing; on resume they are fetched again from the consumer's position.
                self._consumer.pause(self._consumer.assignment())
                self.parked = True
            time.sleep(self.poll_s)
            return 0
        if self.parked:
            self.parked = False
            own = self._paused  # the adapter's retry pauses stay until their delay is over
            self._consumer.resume(
                [tp for tp in self._consumer.assignment() if (tp.topic, tp.partition) not in own]
            )
        return super().poll_once()

    def _commit_to_kafka(self, offsets: list[TopicPartition]) -> None:
        if self.crash_before_commit:
            self.crashed = True
            self.stop()
            return
        if not self.drop_commits:
            super()._commit_to_kafka(offsets)

    @property
    def touched(self) -> bool:
        """True once a fault made this consumer lose commits or crash (it is on its way out)."""
        return self.drop_commits or self.crash_before_commit


class ConsumerThread(threading.Thread):
    def __init__(self, make: Callable[[], ChaosConsumer], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._make = make
        self.consumer: ChaosConsumer | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.consumer = self._make()
            self.ready.set()
            self.consumer.run()
            self.consumer.close()
            close = getattr(self.consumer.handler, "close", None)
            if callable(close):  # the guard's write-behind journal rows (Redis-answered duplicates)
                close()
        except BaseException as exc:  # reported by the demo's verdict, not swallowed
            self.error = exc
            self.ready.set()
            log.exception("consumer %s failed", self.name)


def consumer_thread(
    rel: Reliability, bootstrap: str, group: str, worker: str, policy: RetryPolicy
) -> ConsumerThread:
    """A thread (not started) running one guarded consumer of ``group`` named ``worker``."""

    def make() -> ChaosConsumer:
        handle = idempotent_consumer(rel, group=group)(demo_groups.business_handler(group, worker))
        return ChaosConsumer(bootstrap, TOPIC, group, handle, retry=policy, config=FAST_GROUP, batch_size=50)

    return ConsumerThread(make, worker)


def live_consumers(threads: list[ConsumerThread]) -> list[ChaosConsumer]:
    return [t.consumer for t in threads if t.consumer is not None and t.is_alive()]


def held_partitions(consumers: list[ChaosConsumer]) -> set[tuple[str, int]]:
    """The partitions of :data:`TOPIC` the ``consumers`` hold between them."""
    held: set[tuple[str, int]] = set()
    for c in consumers:
        held |= {tp for tp in c.assigned if tp[0] == TOPIC}
    return held


def wait_assigned(threads: list[ConsumerThread], groups: list[str], timeout_s: float) -> None:
    """Until each group's consumers hold every partition of the topic (Tansu forms a group in ~2 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        failed = [t for t in threads if t.error is not None]
        if failed:
            raise DemoError(f"consumer {failed[0].name} failed to start: {failed[0].error}")
        started = [t.consumer for t in threads if t.consumer is not None]
        if all(len(held_partitions([c for c in started if c.group == g])) == PARTITIONS for g in groups):
            return
        if time.monotonic() > deadline:
            raise DemoError(f"the consumer groups did not form within {timeout_s:.0f}s")
        time.sleep(0.1)


def stop_all(threads: list[ConsumerThread]) -> None:
    for t in threads:
        if t.consumer is not None:
            t.consumer.stop()
    for t in threads:
        t.join(30)
