"""The async stub-first producer on RabbitMQ and PostgreSQL: the rows the sweeper reads, then the sends.

The promise: what commits is sent and recorded; what rolls back is neither; a send the broker refuses stays
PENDING for the sweeper with exactly the row the sync producer would have written; and the async guard of
each expected group confirms its own inbox row until the stub is CONFIRMED.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import aio_pika
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import insert, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession

from reliable import Envelope, Reliability, StubProducer, idempotent_consumer
from reliable import constants as C
from reliable.adapters.amqp import Topology
from reliable.adapters.rabbitmq import RabbitMQSender
from reliable.adapters.rabbitmq_aio import AioRabbitMQSender, declare, delete, to_envelope
from reliable.aio_producer import AsyncStubProducer
from reliable.guard import Reason
from reliable.producer import SendOutcome
from reliable.sender import OutgoingMessage, SendReceipt
from tests.aio.flavours import applied, ledger, make_rel
from tests.conftest import _ensure_clean_schema

pytestmark = pytest.mark.rabbitmq

#: the columns the sweeper and the report read, minus the per-message identity and times
STUB_FACTS = "status, send_count, queue_offset IS NULL, last_error IS NULL, resend_at IS NULL, payload_hash"
INBOX_FACTS = "consumer_group, status, attempts, resend_count, payload_hash"


@pytest.fixture
def rel(postgres_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    _ensure_clean_schema(postgres_url)
    r = make_rel(postgres_url, redis_url, key_prefix)
    yield r
    r.close()


def facts(rel: Reliability, message_id: str) -> tuple[Any, list[Any]]:
    with rel.engine.connect() as conn:
        stub = conn.execute(
            text(f"SELECT {STUB_FACTS} FROM message_stub WHERE message_id = :m"), {"m": message_id}
        ).first()
        rows = conn.execute(
            text(f"SELECT {INBOX_FACTS} FROM message_inbox WHERE message_id = :m ORDER BY consumer_group"),
            {"m": message_id},
        ).all()
    return (None if stub is None else tuple(stub)), [tuple(r) for r in rows]


def test_staged_in_an_async_session_sent_after_commit_and_confirmed_by_each_group(
    rel: Reliability, rabbitmq_url: str
) -> None:
    topo = Topology(queue=f"ap-{uuid.uuid4().hex[:10]}")
    groups = ["billing", "audit"]
    guards = {}
    for g in groups:

        async def h(e: Envelope, session: AsyncSession, g: str = g) -> None:
            await session.execute(insert(ledger).values(message_id=e.message_id, grp=g))

        guards[g] = idempotent_consumer(rel, group=g)(h)

    async def scenario() -> None:
        conn = await aio_pika.connect(rabbitmq_url)
        async with conn:
            ch = await conn.channel()
            queue = await declare(ch, topo)
            async with AioRabbitMQSender(rabbitmq_url, routing_key=lambda m: topo.queue) as sender:
                producer = AsyncStubProducer(rel, sender)
                async with rel.async_session() as s:
                    await producer.stage(s, "p-1", "orders", b'{"n": 1}', groups=groups)
                with pytest.raises(RuntimeError):
                    async with rel.async_session() as s:
                        await producer.stage(s, "p-rolled-back", "orders", b"{}", groups=groups)
                        raise RuntimeError("the business write failed")
                result = await producer.publish("p-2", "orders", b'{"n": 2}', groups=groups)
                assert result.outcome is SendOutcome.SENT
            assert facts(rel, "p-rolled-back") == (None, [])  # neither rows nor a send
            delivered: list[Envelope] = []
            deadline = asyncio.get_running_loop().time() + 20
            while len(delivered) < 2:
                assert asyncio.get_running_loop().time() < deadline, f"only {delivered} arrived"
                m = await queue.get(no_ack=True, fail=False)
                if m is None:
                    await asyncio.sleep(0.02)
                else:
                    delivered.append(to_envelope(m))
            for g in groups:
                assert [d.reason for d in await guards[g].decide_batch(delivered)] == [Reason.PROCESSED] * 2
            await delete(ch, topo)
        await rel.aclose()

    asyncio.run(scenario())
    stub, inbox = facts(rel, "p-1")
    assert stub[:2] == ("CONFIRMED", 1)
    assert [r[:3] for r in inbox] == [("audit", "CONFIRMED", 0), ("billing", "CONFIRMED", 0)]
    assert applied(rel, "billing") == applied(rel, "audit") == {"p-1": 1, "p-2": 1}


def test_a_refused_send_leaves_the_row_the_sync_producer_leaves(rel: Reliability, rabbitmq_url: str) -> None:
    nowhere = f"nowhere-{uuid.uuid4().hex[:8]}"  # unroutable: the broker returns it, the send is refused
    with RabbitMQSender(rabbitmq_url, routing_key=lambda m: nowhere) as blocking:
        sync = StubProducer(rel, blocking).publish("sync-1", "orders", b"{}", groups=["billing", "audit"])

    async def scenario() -> Any:
        async with AioRabbitMQSender(rabbitmq_url, routing_key=lambda m: nowhere) as sender:
            result = await AsyncStubProducer(rel, sender).publish(
                "async-1", "orders", b"{}", groups=["billing", "audit"]
            )
        await rel.aclose()
        return result

    result = asyncio.run(scenario())
    assert (sync.outcome, result.outcome) == (SendOutcome.FAILED, SendOutcome.FAILED)
    assert facts(rel, "async-1") == facts(rel, "sync-1")
    assert facts(rel, "async-1")[0][:4] == ("PENDING", 1, True, False)  # due for the sweeper, with its error


def test_many_concurrent_commits_all_send_without_exhausting_the_pool(
    rel: Reliability, rabbitmq_url: str
) -> None:
    """More committing tasks than the pool has connections: every after-commit send still happens."""
    topo = Topology(queue=f"ap-{uuid.uuid4().hex[:10]}")
    tasks = 40  # the engine's pool holds 15 (5 + 10 overflow)

    async def scenario() -> None:
        conn = await aio_pika.connect(rabbitmq_url)
        async with conn:
            ch = await conn.channel()
            await declare(ch, topo)
            async with AioRabbitMQSender(rabbitmq_url, routing_key=lambda m: topo.queue) as sender:
                producer = AsyncStubProducer(rel, sender)

                async def one(i: int) -> None:
                    async with rel.async_session() as s:
                        await producer.stage(s, f"c-{i}", "orders", b"{}", groups=["g"])

                await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(tasks))), 25)
                await producer.aclose()
            await delete(ch, topo)
        await rel.aclose()

    asyncio.run(scenario())
    with rel.engine.connect() as c:
        sent = c.execute(
            text("SELECT count(*) FROM message_stub WHERE queue_offset IS NOT NULL")
        ).scalar_one()
    assert sent == tasks


class LockedStubSender:
    """Hands each message to RabbitMQ only once another connection holds its committed stub row locked (the
    row the producer records the send on), and keeps that lock until a record has failed on it."""

    def __init__(self, inner: AioRabbitMQSender, rel: Reliability) -> None:
        self.inner = inner
        self.rel = rel
        self.holder: asyncio.Task[None] | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        locked = asyncio.Event()
        self.holder = asyncio.create_task(self._hold(message.message_id, locked))
        await asyncio.wait_for(locked.wait(), 10)
        return await self.inner.send(message)

    async def _hold(self, message_id: str, locked: asyncio.Event) -> None:
        before = _record_retries()
        async with self.rel.aio.engine().begin() as conn:
            await conn.execute(
                text("SELECT 1 FROM message_stub WHERE message_id = :m FOR UPDATE"), {"m": message_id}
            )
            locked.set()
            deadline = asyncio.get_running_loop().time() + 10
            while _record_retries() == before and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)


def _record_retries() -> float:
    return REGISTRY.get_sample_value("reliable_producer_record_failures_total", {"outcome": "retried"}) or 0.0


def test_a_send_record_retried_after_a_database_error_lets_the_loops_other_tasks_run(
    rel: Reliability, postgres_url: str, rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The after-commit send runs inside ``await session.commit()``; when recording its result fails (here a
    lock timeout) the producer waits and tries again. That wait must not stop the event loop: every consumer
    and heartbeat of the process runs on it. It was ``time.sleep``, and the loop stood still for it."""
    monkeypatch.setattr(C, "PRODUCER_RECORD_BACKOFF_S", 0.5)  # a wait long enough to be seen
    impatient = make_url(postgres_url).update_query_dict({"options": "-c lock_timeout=100"})
    producer_rel = Reliability(impatient.render_as_string(hide_password=False), None)
    nowhere = f"nowhere-{uuid.uuid4().hex[:8]}"  # refused by the broker: a FAILED send, recorded all the same
    retries_before = _record_retries()
    gaps: list[float] = []

    async def ticker(stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            gaps.append(loop.time() - last)
            last = loop.time()

    async def scenario() -> None:
        stop = asyncio.Event()
        ticking = asyncio.create_task(ticker(stop))
        async with AioRabbitMQSender(rabbitmq_url, routing_key=lambda m: nowhere) as inner:
            sender = LockedStubSender(inner, rel)
            producer = AsyncStubProducer(producer_rel, sender)
            async with producer_rel.async_session() as s:
                await producer.stage(s, "blip-1", "orders", b"{}", groups=["g"])
            assert sender.holder is not None
            await sender.holder
            await producer.aclose()
        stop.set()
        await ticking
        await producer_rel.aclose()
        await rel.aclose()

    try:
        asyncio.run(scenario())
    finally:
        producer_rel.close()
    assert _record_retries() > retries_before, "the record never failed: nothing was retried"
    assert facts(rel, "blip-1")[0][:4] == ("PENDING", 1, True, False)  # recorded by the retry
    assert max(gaps) < 0.25, f"the loop stood still for {max(gaps):.3f} s during the record's retry"
