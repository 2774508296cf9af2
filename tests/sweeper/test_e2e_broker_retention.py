"""End to end: a group stopped longer than the broker's retention, on a quiet topic, still gets every message.

RocketMQ deletes commit-log segments by age (``fileReservedTime``, 72 h) whether or not every group has
read them. A group stopped for longer finds its position below the queue's min offset when it comes back
(the broker moves it up), and on a quiet queue nothing new ever raises its watermark past the messages it
owed, while the broker's max offset stays above them: before the sweeper asked the broker's min offset,
those rows were ``queued`` for ever and a stall alarm blamed the consumers. Two groups on one topic,
PostgreSQL, the broker on a manual clock (the 72 hours pass in one step).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, func, select

from broker_sim.broker.api import ConsumeFromWhere
from broker_sim.broker.broker import Broker
from broker_sim.client.producer import Producer
from broker_sim.client.push_consumer import PushConsumer
from broker_sim.clock import ManualClock
from broker_sim.common.message import Message
from reliable import Reliability
from reliable.adapters.broker_sim import BrokerSimSender, GuardedListener, send_back_to_dlq
from reliable.decorator import idempotent_consumer
from reliable.models import MessageInbox, MessageLog
from reliable.producer import StubProducer
from reliable.sweeper import FixedBackoff, Sweeper
from reliable.types import StubStatus
from tests.sweeper.helpers import MemoryChannel, e2e_reliability

TOPIC, OTHER = "RetainedOrders", "RetainedOther"
GROUPS = ("retention_fast", "retention_slow")
#: 04:00 UTC: the broker deletes expired segments at 04 (``deleteWhen``)
START_MS = int(dt.datetime(2026, 11, 2, 4, 0, tzinfo=dt.UTC).timestamp() * 1000)
effects = MetaData()
applied = Table(
    "retention_e2e_applied",
    effects,
    Column("consumer_group", String(64), primary_key=True),
    Column("message_id", String(64), primary_key=True),
)


@pytest.fixture
def rel(postgres_url: str) -> Iterator[Reliability]:
    yield from e2e_reliability(postgres_url, effects)


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        threading.Event().wait(0.05)


def confirmed(rel: Reliability, group: str) -> int:
    with rel.engine.connect() as conn:
        return int(
            conn.scalar(
                select(func.count()).where(
                    MessageInbox.consumer_group == group, MessageInbox.status == StubStatus.CONFIRMED
                )
            )
            or 0
        )


class Groups:
    """The topic's consumer groups, each a guarded push consumer on the in-process broker."""

    def __init__(self, rel: Reliability, broker: Broker, offsets: Path) -> None:
        self.rel, self.broker, self.offsets = rel, broker, offsets
        self.running: dict[str, PushConsumer] = {}

    def start(self, group: str) -> None:
        def handle(env: Any, session: Any) -> None:  # applied twice = primary-key violation
            session.execute(applied.insert().values(consumer_group=group, message_id=env.message_id))

        guarded = idempotent_consumer(self.rel, group=group)(handle)
        consumer = PushConsumer(
            self.broker,
            group,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            local_offset_dir=str(self.offsets / group),
        )
        consumer.subscribe(TOPIC, "*", GuardedListener(guarded, send_back_to_dlq(consumer.transport, group)))
        consumer.start()
        self.running[group] = consumer

    def stop(self, group: str) -> None:
        self.running.pop(group).shutdown()

    def stop_all(self) -> None:
        for group in list(self.running):
            self.stop(group)


def test_a_group_stopped_longer_than_the_brokers_retention_gets_what_it_owed_on_a_quiet_topic(
    rel: Reliability, tmp_path: Path
) -> None:
    clock = ManualClock(START_MS)
    broker = Broker(
        str(tmp_path / "store"),
        topics={TOPIC: 1, OTHER: 1},
        commit_log_file_size=64 * 1024,
        clean_resource_interval_ms=3_600_000_000,  # the test runs the expiry pass itself
        clock=clock,
    )
    broker.start()
    producer = Producer(broker, "retention_p")
    producer.start()
    groups = Groups(rel, broker, tmp_path / "offsets")
    stub_producer = StubProducer(rel, BrokerSimSender(producer), default_group=GROUPS[0])

    def publish(ids: list[str], pad: int = 0) -> None:
        with stub_producer.transaction() as tx:
            for message_id in ids:
                tx.stage(message_id, TOPIC, message_id.encode() + b"x" * pad, groups=list(GROUPS))

    try:
        for group in GROUPS:
            groups.start(group)
        publish([f"a-{i}" for i in range(5)])
        wait_until(lambda: all(confirmed(rel, g) == 5 for g in GROUPS), "both groups to take a-*")
        groups.stop(GROUPS[1])
        owed = [f"b-{i:02d}" for i in range(30)]
        publish(owed, pad=2000)  # ~60 KiB: the segments that will expire
        wait_until(lambda: confirmed(rel, GROUPS[0]) == 35, "the running group to take b-*")
        for _ in range(40):  # another topic's traffic closes those segments; the topic itself stays quiet
            producer.send(Message(topic=OTHER, body=b"y" * 2000))
        clock.advance(72 * 3600 + 60)  # the slow group's stop outlasts fileReservedTime (72 h)
        assert broker.store.run_expiry().deleted_commit_log_files
        top = broker.get_max_offset(TOPIC, 0)
        assert broker.get_min_offset(TOPIC, 0) == top == 35  # nothing left of the topic's messages

        groups.start(GROUPS[1])  # back: the broker moves its position up to the min offset
        sweep_producer = Producer(broker, "retention_sweeper")
        sweep_producer.start()
        channel = MemoryChannel()
        sweeper = Sweeper(
            rel, BrokerSimSender(sweep_producer), backoff=FixedBackoff((1.0,)), channels=[channel]
        )
        try:
            deadline = time.monotonic() + 60
            resent = 0
            while confirmed(rel, GROUPS[1]) < 35:
                assert time.monotonic() < deadline, f"slow group confirmed {confirmed(rel, GROUPS[1])} of 35"
                summary = sweeper.run_once()
                resent += summary.resent
                assert summary.stall_alarms == 0  # its consumers are healthy: no alarm blaming them
                threading.Event().wait(0.2)  # the sweeper's own schedule, not synchronisation
        finally:
            sweep_producer.shutdown()
    finally:
        groups.stop_all()
        producer.shutdown()
        broker.shutdown()

    assert resent == len(owed)  # each deleted message once, to the slow group alone
    assert channel.notices == []
    with rel.engine.connect() as conn:
        done = set(conn.execute(select(applied.c.consumer_group, applied.c.message_id)).all())
        deliveries = conn.execute(
            select(MessageLog.consumer_group, MessageLog.message_id, MessageLog.topic)
        ).all()
    every = [f"a-{i}" for i in range(5)] + owed
    assert done == {(g, m) for g in GROUPS for m in every}
    fast = [(m, t) for g, m, t in deliveries if g == GROUPS[0]]
    assert sorted(fast) == sorted((m, TOPIC) for m in every)  # the running group saw no copy
    slow = {(m, t) for g, m, t in deliveries if g == GROUPS[1]}
    assert {(m, f"%RETRY%{GROUPS[1]}") for m in owed} <= slow
