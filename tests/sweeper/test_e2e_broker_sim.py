"""End to end: a broker_sim broker loses unflushed messages in a crash; sweeps + guarded consumers heal it.

The crash also makes the restarted broker hand the lost offsets to new messages — the case behind the
selection's ``queue_offset <= watermark`` rule (see reliable/sweeper/selection.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, select

from reliable import Reliability
from reliable.models import MessageInbox, MessageLog
from reliable.types import LogOutcome, StubStatus
from tests.sweeper.helpers import count_stubs as count
from tests.sweeper.helpers import e2e_reliability

pytest.importorskip("broker_sim.broker.broker")

from broker_sim.broker.api import ConsumeFromWhere
from broker_sim.broker.broker import Broker
from broker_sim.client.producer import Producer
from broker_sim.client.push_consumer import PushConsumer
from reliable.adapters.broker_sim import (
    BrokerSimProbe,
    BrokerSimSender,
    GuardedListener,
    send_back_to_dlq,
)
from reliable.decorator import idempotent_consumer
from reliable.producer import StubProducer
from reliable.sweeper import FixedBackoff, Sweeper

TOPIC, GROUP = "SweepE2E", "sweep_e2e_g"
CONFIG: dict[str, Any] = {
    "topics": {TOPIC: 4},
    "message_delay_level": "1s 1s 1s",
    "commit_log_file_size": 8 << 20,
    "flush_interval_commit_log_ms": 3_600_000,  # nothing is flushed before the crash: all of it is lost
}
effects = MetaData()
applied = Table("sweeper_e2e_applied", effects, Column("message_id", String(64), primary_key=True))


@pytest.fixture
def rel(sqlite_url: str) -> Iterator[Reliability]:
    yield from e2e_reliability(sqlite_url, effects)


def publish(rel: Reliability, broker: Broker, ids: list[str]) -> None:
    producer = Producer(broker, "sweep_e2e_p")
    producer.start()
    try:
        stub_producer = StubProducer(rel, BrokerSimSender(producer), default_group=GROUP)
        with stub_producer.transaction() as tx:
            for message_id in ids:
                tx.stage(message_id, TOPIC, message_id.encode())
        assert all(r.receipt is not None for r in tx.results)
    finally:
        producer.shutdown()


@pytest.mark.slow
def test_crash_lost_messages_end_confirmed_after_sweeps(rel: Reliability, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = Broker(str(store), **CONFIG)
    first.start()
    lost = [f"lost-{i:02d}" for i in range(20)]
    publish(rel, first, lost)  # 5 per queue, offsets 0..4, never flushed
    first.faults.crash_broker(first)

    broker = Broker(str(store), **CONFIG)
    broker.start()
    try:
        assert [broker.get_max_offset(TOPIC, q) for q in range(4)] == [0, 0, 0, 0]  # all 20 lost
        fresh = [f"new-{i:02d}" for i in range(24)]  # 6 per queue: they take the lost offsets 0..5
        publish(rel, broker, fresh)

        def handle(env: Any, session: Any) -> None:
            session.execute(applied.insert().values(message_id=env.message_id))  # twice = PK violation

        guarded = idempotent_consumer(rel, group=GROUP)(handle)
        consumer = PushConsumer(broker, GROUP, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        consumer.subscribe(TOPIC, "*", GuardedListener(guarded, send_back_to_dlq(consumer.transport, GROUP)))
        consumer.start()
        sweep_producer = Producer(broker, "sweep_e2e_sweeper")
        sweep_producer.start()
        sweeper = Sweeper(
            rel,
            BrokerSimSender(sweep_producer),
            probe=BrokerSimProbe(consumer.transport),
            backoff=FixedBackoff((1.0,)),
            max_sends=5,
        )
        resent = 0
        try:
            deadline = time.monotonic() + 90
            while count(rel, StubStatus.CONFIRMED) < len(lost) + len(fresh):
                assert time.monotonic() < deadline, f"confirmed {count(rel, StubStatus.CONFIRMED)}"
                resent += sweeper.run_once().resent
                threading.Event().wait(0.3)  # the sweeper's own schedule, not synchronisation
        finally:
            consumer.shutdown()
            sweep_producer.shutdown()
    finally:
        broker.shutdown()
    assert count(rel, StubStatus.PENDING) == 0 and count(rel, StubStatus.DEAD) == 0
    assert resent >= len(lost)
    with rel.engine.connect() as conn:  # every lost message was sent again, to its group's retry topic …
        rows = conn.execute(
            select(MessageInbox.resend_count, MessageInbox.queue_offset).where(
                MessageInbox.message_id.in_(lost)
            )
        ).all()
        delivered = set(
            conn.execute(
                select(MessageLog.message_id, MessageLog.topic).where(
                    MessageLog.outcome == LogOutcome.SUCCESS
                )
            ).all()
        )
    assert len(rows) == len(lost) and all(count >= 1 and offset is not None for count, offset in rows)
    # … and applied from there (the broker has no other copy). A fresh message may also be re-sent: a batch of
    # later offsets of its queue can raise the watermark while its own batch is still in another consumer
    # thread (at-least-once; the guard applies it once, from whichever copy comes first)
    assert {m for m, t in delivered if t == f"%RETRY%{GROUP}"} >= set(lost)
    assert {m for m, t in delivered if t == TOPIC} <= set(fresh)
    assert len(delivered) == len(lost) + len(fresh)
    with rel.engine.connect() as conn:
        assert set(conn.scalars(select(applied.c.message_id))) == set(lost) | set(fresh)
