"""Consume, then produce: a handler stages a follow-up message through its guarded session.

The handler's session never commits itself — the guard commits its connection — so the producer's
after-commit hook never fired, and the follow-up waited for the sweeper's first resend (a minute or more, and
every later copy of it was a "targeted" resend). The guard sends it once its transaction has committed, and
never what a failed handler staged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from reliable import ConsumeResult, Envelope, Reliability, StubProducer, StubStatus, idempotent_consumer
from reliable.aio_producer import AsyncStubProducer
from reliable.models import MessageStub
from reliable.sender import OutgoingMessage, SendReceipt
from tests.conftest import _ensure_clean_schema
from tests.core.guard_helpers import apply, env, make_rel
from tests.core.producer.support import RecordingSender


@pytest.fixture
def rel(db_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    _ensure_clean_schema(db_url)
    r = make_rel(db_url, redis_url, key_prefix, max_attempts=2)
    yield r
    r.close()


def _stub(rel: Reliability, message_id: str) -> MessageStub | None:
    with rel.session() as s:
        return s.get(MessageStub, message_id)


def test_a_message_staged_by_a_handler_is_sent_when_the_guard_commits(rel: Reliability) -> None:
    sender = RecordingSender()
    producer = StubProducer(rel, sender, default_group="shipping")

    @idempotent_consumer(rel, group="billing")
    def handle(e: Envelope, session: Session) -> None:
        apply(e, session)
        producer.stage(session, f"ship-{e.message_id}", "shipments", e.body)
        assert sender.sent == []  # not before the commit

    handle(env("o-1"))
    assert [m.message_id for m in sender.sent] == ["ship-o-1"]
    row = _stub(rel, "ship-o-1")
    assert row is not None and row.send_count == 1 and row.queue_offset is not None  # recorded as sent


def test_what_a_failed_handler_staged_is_never_sent(rel: Reliability) -> None:
    sender = RecordingSender()
    producer = StubProducer(rel, sender, default_group="shipping")

    @idempotent_consumer(rel, group="billing")
    def handle(e: Envelope, session: Session) -> None:
        producer.stage(session, f"ship-{e.message_id}", "shipments", e.body)
        if e.message_id == "bad":
            raise RuntimeError("fails after staging")
        apply(e, session)

    # a batch: the whole transaction is rolled back once, then each runs in a savepoint of its own
    handle.batch([env("good-1"), env("bad"), env("good-2")])
    assert sorted(m.message_id for m in sender.sent) == ["ship-good-1", "ship-good-2"]
    assert _stub(rel, "ship-bad") is None


class _AsyncRecording:
    def __init__(self) -> None:
        self.sent: list[OutgoingMessage] = []

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        self.sent.append(message)
        return SendReceipt(0, len(self.sent), message.message_id)


def test_an_async_handler_staging_through_its_session_sends_after_the_commit(rel: Reliability) -> None:
    sender = _AsyncRecording()
    producer = AsyncStubProducer(rel, sender, default_group="shipping")

    @idempotent_consumer(rel, group="billing")
    async def handle(e: Envelope, session: AsyncSession) -> None:
        await producer.stage(session, f"ship-{e.message_id}", "shipments", e.body)
        assert sender.sent == []

    async def scenario() -> None:
        await handle(env("a-1"))
        await producer.aclose()
        await rel.aclose()

    asyncio.run(scenario())
    assert [m.message_id for m in sender.sent] == ["ship-a-1"]
    row = _stub(rel, "ship-a-1")
    assert row is not None and row.status is StubStatus.PENDING and row.send_count == 1


def test_concurrent_async_handlers_each_send_what_they_staged(rel: Reliability) -> None:
    """Deliveries on one loop interleave at every await, and share the guard's per-thread session object:
    the second one's bookkeeping removed the first one's, which then failed after its handler."""
    sender = _AsyncRecording()
    producer = AsyncStubProducer(rel, sender, default_group="shipping")

    @idempotent_consumer(rel, group="billing")
    async def handle(e: Envelope, session: AsyncSession) -> None:
        await asyncio.sleep(0)  # let the others in
        await producer.stage(session, f"ship-{e.message_id}", "shipments", e.body)
        await asyncio.sleep(0)

    async def scenario() -> list[object]:
        results = await asyncio.gather(*(handle(env(f"c-{i}")) for i in range(12)))
        await producer.aclose()
        await rel.aclose()
        return list(results)

    assert all(r is ConsumeResult.SUCCESS for r in asyncio.run(scenario()))
    assert sorted(m.message_id for m in sender.sent) == sorted(f"ship-c-{i}" for i in range(12))
