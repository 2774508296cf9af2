"""The topology a team runs: one exchange, one queue per consumer group (billing, audit), a stub-first
producer writing an inbox row for both groups, the blocking consumer per group — and the promise checked
per group: the database effect once, nothing lost silently, the right statuses, resends only to the group
that lacks a message, a person told when one group gives up, one alarm for a group never deployed.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, StubProducer, StubStatus, idempotent_consumer
from reliable.adapters.rabbitmq import HEADER_DEAD_REASON, RabbitMQConsumer, RabbitMQSender, Topology
from reliable.adapters.rabbitmq_aio import AioRabbitMQConsumer
from reliable.models import MessageInbox, MessageStub, utcnow
from reliable.sweeper import FixedBackoff, Sweeper
from reliable.sweeper.notices import NoticeKind
from tests.adapters.rabbitmq.conftest import TIMEOUT_S, TOPIC, queue_depth
from tests.sweeper.helpers import MemoryChannel

pytestmark = pytest.mark.rabbitmq

GROUPS = ("billing", "audit")

md = MetaData()
effects = Table(
    "rabbitmq_two_group_effect",
    md,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("consumer_group", String(64), nullable=False),
    Column("message_id", String(64), nullable=False),
)


@dataclass
class Fanout:
    """One exchange and a queue per group, all named ``two_groups_…``."""

    exchange: str
    topologies: dict[str, Topology]

    def queue(self, group: str) -> str:
        return self.topologies[group].queue

    def group_queue(self, topic: str, group: str) -> str:
        return self.queue(group)


@pytest.fixture
def rel(rel: Reliability) -> Reliability:
    """The adapter tests' ``Reliability`` (tests/adapters/rabbitmq/conftest.py), with this file's effect
    table — one row per group's effect — created and empty."""
    md.create_all(rel.engine)
    with rel.engine.begin() as conn:
        conn.execute(delete(effects))
    return rel


@pytest.fixture
def fanout(rabbitmq_url: str) -> Iterator[Fanout]:
    name = f"two_groups_{uuid.uuid4().hex[:10]}"
    exchange = f"{name}.x"
    topos = {g: Topology(queue=f"{name}.{g}", exchange=exchange, binding_key=TOPIC) for g in GROUPS}
    yield from declared(rabbitmq_url, Fanout(exchange, topos))


def declared(rabbitmq_url: str, fanout: Fanout) -> Iterator[Fanout]:
    """``fanout``'s exchange and queues declared for the test, deleted after it (a fixture yields from it)."""
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    ch = conn.channel()
    for t in fanout.topologies.values():
        t.declare(ch)
    yield fanout
    for t in fanout.topologies.values():
        t.delete(ch)
    conn.close()


def handler(rel: Reliability, group: str, fail: set[str] | None = None) -> Any:
    @idempotent_consumer(rel, group=group)
    def handle(env: Envelope, session: Session) -> None:
        assert env.message_id is not None
        session.execute(effects.insert().values(consumer_group=group, message_id=env.message_id))
        if fail and env.message_id in fail:
            raise RuntimeError(f"{group} cannot process {env.message_id}")

    return handle


def effect_counts(rel: Reliability) -> dict[tuple[str, str], int]:
    with rel.session() as s:
        rows = s.execute(
            select(effects.c.consumer_group, effects.c.message_id, func.count()).group_by(
                effects.c.consumer_group, effects.c.message_id
            )
        ).all()
    return {(g, m): n for g, m, n in rows}


def inbox(rel: Reliability, group: str, mid: str) -> MessageInbox:
    with rel.session() as s:
        row = s.get(MessageInbox, (group, mid))
        assert row is not None
        s.expunge(row)
        return row


def drain(url: str, fanout: Fanout, rel: Reliability, group: str, acks: int, **kw: Any) -> RabbitMQConsumer:
    with RabbitMQConsumer(url, fanout.topologies[group], handler(rel, group, **kw), retry_delay_s=0) as c:
        assert c.run(until=lambda: c.counts["ack"] + c.counts["dead_letter"] >= acks, timeout_s=TIMEOUT_S)
    return c


def test_a_copy_one_group_lost_is_resent_to_that_group_only(
    rel: Reliability, fanout: Fanout, rabbitmq_url: str, admin: Any
) -> None:
    with RabbitMQSender(rabbitmq_url, exchange=fanout.exchange, group_queue=fanout.group_queue) as sender:
        producer = StubProducer(rel, sender)
        producer.publish("m-1", TOPIC, b"one", groups=GROUPS)
        admin.queue_purge(fanout.queue("billing"))  # billing's copy is lost (a queue purged by hand)
        producer.publish("m-2", TOPIC, b"two", groups=GROUPS)
        drain(rabbitmq_url, fanout, rel, "billing", 1)
        drain(rabbitmq_url, fanout, rel, "audit", 2)
        later = utcnow() + dt.timedelta(minutes=5)
        sweeper = Sweeper(rel, sender, backoff=FixedBackoff((60.0,)), max_sends=3, clock=lambda: later)
        summary = sweeper.run_once()
        assert summary.resent == 1, summary.line()
    assert queue_depth(admin, fanout.queue("audit")) == 0
    assert queue_depth(admin, fanout.queue("billing")) == 1
    drain(rabbitmq_url, fanout, rel, "billing", 1)
    assert effect_counts(rel) == {(g, m): 1 for g in GROUPS for m in ("m-1", "m-2")}
    assert inbox(rel, "billing", "m-1").resend_count == 1
    assert inbox(rel, "audit", "m-1").resend_count == 0
    with rel.session() as s:
        assert (
            s.scalar(select(MessageStub.status).where(MessageStub.message_id == "m-1"))
            is StubStatus.CONFIRMED
        )


def test_a_group_that_keeps_failing_dead_letters_and_a_person_is_told(
    rel: Reliability, fanout: Fanout, rabbitmq_url: str, admin: Any
) -> None:
    with RabbitMQSender(rabbitmq_url, exchange=fanout.exchange, group_queue=fanout.group_queue) as sender:
        StubProducer(rel, sender).publish("bad-1", TOPIC, b"poison", groups=GROUPS)
        c = drain(rabbitmq_url, fanout, rel, "billing", 1, fail={"bad-1"})
        assert c.counts["dead_letter"] == 1 and c.counts["requeue"] == 2
        drain(rabbitmq_url, fanout, rel, "audit", 1)
        channel = MemoryChannel()
        later = utcnow() + dt.timedelta(minutes=5)
        sweeper = Sweeper(rel, sender, channels=[channel], max_sends=3, clock=lambda: later)
        summary = sweeper.run_once()
        assert summary.resent == 0, summary.line()
    method, props, _ = admin.basic_get(fanout.topologies["billing"].dead_letter_queue, auto_ack=True)
    assert method is not None and "max_attempts" in props.headers[HEADER_DEAD_REASON]
    assert inbox(rel, "billing", "bad-1").status is StubStatus.DEAD
    assert inbox(rel, "audit", "bad-1").status is StubStatus.CONFIRMED
    assert effect_counts(rel) == {("audit", "bad-1"): 1}
    assert [(n.consumer_group, n.message_id) for n in channel.notices] == [("billing", "bad-1")]


def test_a_different_body_under_a_known_id_is_dead_lettered_with_its_reason(
    rel: Reliability, fanout: Fanout, rabbitmq_url: str, admin: Any
) -> None:
    with RabbitMQSender(rabbitmq_url, exchange=fanout.exchange, group_queue=fanout.group_queue) as sender:
        StubProducer(rel, sender).publish("m-1", TOPIC, b"real", groups=GROUPS)
    props = pika.BasicProperties(message_id="m-1", delivery_mode=2)
    admin.basic_publish(fanout.exchange, TOPIC, b"forged", props)
    drain(rabbitmq_url, fanout, rel, "billing", 2)
    drain(rabbitmq_url, fanout, rel, "audit", 2)
    assert effect_counts(rel) == {("billing", "m-1"): 1, ("audit", "m-1"): 1}
    for g in GROUPS:
        method, props, body = admin.basic_get(fanout.topologies[g].dead_letter_queue, auto_ack=True)
        assert method is not None and body == b"forged", g
        assert str(props.headers[HEADER_DEAD_REASON]).startswith("payload_mismatch"), g


def test_a_group_whose_queue_is_never_consumed_raises_one_alarm_not_a_resend_storm(
    rel: Reliability, fanout: Fanout, rabbitmq_url: str, admin: Any
) -> None:
    """audit's consumers were never deployed. RabbitMQ has no loss probe, but the group has no position on
    the topic at all: a person must hear of it once, soon — not a day later, after every message has been
    re-sent into the queue nobody reads, as one DEAD notice per message (DESIGN.md §3)."""
    with RabbitMQSender(rabbitmq_url, exchange=fanout.exchange, group_queue=fanout.group_queue) as sender:
        producer = StubProducer(rel, sender)
        for i in range(3):
            producer.publish(f"m-{i}", TOPIC, b"x", groups=GROUPS)
        drain(rabbitmq_url, fanout, rel, "billing", 3)
        channel = MemoryChannel()
        now = utcnow()
        sweeper = Sweeper(rel, sender, channels=[channel], max_sends=3, stuck_after_s=300, clock=lambda: now)
        alarms = 0
        for minutes in (10, 60, 6 * 60, 12 * 60):  # within max_unconfirmed_age (a day)
            now = utcnow() + dt.timedelta(minutes=minutes)
            summary = sweeper.run_once()
            assert (summary.resent, summary.dead) == (0, 0), summary.line()
            alarms += summary.never_consumed
    assert alarms == 1
    assert [(n.kind, n.consumer_group, n.topic) for n in channel.notices] == [
        (NoticeKind.NEVER_CONSUMED, "audit", TOPIC)
    ]
    assert queue_depth(admin, fanout.queue("audit")) == 3  # nothing piled onto the unread queue
    drain(rabbitmq_url, fanout, rel, "audit", 3)  # deployed at last
    assert effect_counts(rel) == {(g, f"m-{i}"): 1 for g in GROUPS for i in range(3)}
    with rel.session() as s:
        assert set(s.scalars(select(MessageStub.status))) == {StubStatus.CONFIRMED}


AIO_WORKER = """
import asyncio
import sys
from reliable import Reliability, idempotent_consumer
from reliable.adapters.rabbitmq_aio import AioRabbitMQConsumer
from reliable.adapters.amqp import Topology
from tests.adapters.rabbitmq.test_two_groups import effects
db, rd, prefix, url, queue, exchange, topic, group = sys.argv[1:9]
rel = Reliability(db, rd, key_prefix=prefix, lease_ms=3000, journal_write_behind=False)

@idempotent_consumer(rel, group=group)
async def handle(env, session):
    await session.execute(effects.insert().values(consumer_group=group, message_id=env.message_id))
    await asyncio.sleep(0.3)

async def main():
    topo = Topology(queue=queue, exchange=exchange, binding_key=topic)
    async with AioRabbitMQConsumer(url, topo, handle, prefetch=8, retry_delay_s=0.05):
        await asyncio.Event().wait()

asyncio.run(main())
"""


def test_an_asyncio_worker_killed_with_deliveries_in_flight_leaves_each_effect_once_for_two_survivors(
    rel: Reliability,
    fanout: Fanout,
    rabbitmq_url: str,
    admin: Any,
    postgres_url: str,
    redis_url: str,
    key_prefix: str,
) -> None:
    """(1) + (2): an aio-pika worker (prefetch 8, eight handlers at once) is SIGKILLed mid-batch; its unacked
    deliveries go back to the queue, two asyncio consumers (prefetch 4 each) share the rest. Each message's
    effect once, every billing row CONFIRMED, nothing dead-lettered."""
    n = 30
    topo = fanout.topologies["billing"]
    with RabbitMQSender(rabbitmq_url, exchange=fanout.exchange, group_queue=fanout.group_queue) as sender:
        producer = StubProducer(rel, sender)
        for i in range(n):
            producer.publish(f"m-{i}", TOPIC, b"x", groups=GROUPS)
        argv = [
            postgres_url,
            redis_url,
            key_prefix,
            rabbitmq_url,
            topo.queue,
            fanout.exchange,
            TOPIC,
            "billing",
        ]
        proc = subprocess.Popen([sys.executable, "-c", AIO_WORKER, *argv])
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while sum(effect_counts(rel).values()) < 10:
                assert time.monotonic() < deadline and proc.poll() is None, "the worker made no progress"
                time.sleep(0.02)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    @idempotent_consumer(rel, group="billing")
    async def handle(env: Envelope, session: AsyncSession) -> None:
        await session.execute(effects.insert().values(consumer_group="billing", message_id=env.message_id))

    def billing_pending() -> int:
        with rel.session() as s:
            return int(
                s.scalar(
                    select(func.count())
                    .select_from(MessageInbox)
                    .where(
                        MessageInbox.consumer_group == "billing", MessageInbox.status != StubStatus.CONFIRMED
                    )
                )
                or 0
            )

    async def survivors() -> list[Counter[str]]:
        async with (
            AioRabbitMQConsumer(rabbitmq_url, topo, handle, prefetch=4, retry_delay_s=0.05) as a,
            AioRabbitMQConsumer(rabbitmq_url, topo, handle, prefetch=4, retry_delay_s=0.05) as b,
        ):
            deadline = time.monotonic() + TIMEOUT_S
            while billing_pending() or queue_depth(admin, topo.queue):
                assert time.monotonic() < deadline, (a.counts, b.counts)
                await asyncio.sleep(0.05)
            return [a.counts, b.counts]

    counts = asyncio.run(survivors())
    assert sum(c["dead_letter"] + c["dead_letter_fallback"] + c["handler_error"] for c in counts) == 0
    assert effect_counts(rel) == {("billing", f"m-{i}"): 1 for i in range(n)}
    assert queue_depth(admin, topo.dead_letter_queue) == 0
