"""A sender that raises ``CancelledError`` although nobody cancelled the sending task.

Why it matters: the send happens after the caller's commit, and every layer after the commit catches
``Exception`` only (``CancelledError`` is a ``BaseException``). So a client library that cancelled a future of
its own made a committed ``stage``, a ``publish`` and a guarded handler's staged send raise ``CancelledError``
to the caller — a processed message neither acked nor requeued by its adapter. It is a refused send: the stub
stays PENDING with the error for the sweeper. A cancel of the task itself still reaches the caller.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncSession

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.aio_producer import AsyncStubProducer
from reliable.guard import Reason
from reliable.producer import SendOutcome
from reliable.sender import OutgoingMessage, SendReceipt
from tests.aio.flavours import applied, env, ledger, make_rel


class StrayCancelSender:
    """An ``AsyncSender`` whose client library cancels a future of its own under it, or that hangs (``hang``
    set) until the task awaiting it is cancelled; otherwise it accepts."""

    def __init__(self) -> None:
        self.stray = True
        self.hang = False
        self.sending = asyncio.Event()
        self._offsets = itertools.count(1)

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        self.sending.set()
        if self.hang:
            await asyncio.get_running_loop().create_future()  # never resolved: only a cancel ends it
        if self.stray:
            inner = asyncio.get_running_loop().create_future()
            inner.cancel()  # the library's own request, cancelled under the sender
            await inner
        return SendReceipt(0, next(self._offsets))


@pytest.fixture
def rel(db_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    r = make_rel(db_url, redis_url, key_prefix)
    yield r
    r.close()


def stub(rel: Reliability, message_id: str) -> tuple[str, int, str | None] | None:
    with rel.engine.connect() as conn:
        row = conn.execute(
            text("SELECT status, send_count, last_error FROM message_stub WHERE message_id = :m"),
            {"m": message_id},
        ).first()
    return None if row is None else (str(row[0]), int(row[1]), row[2])


def test_a_stray_cancel_from_the_sender_is_a_refused_send_not_raised_after_the_commit(
    rel: Reliability,
) -> None:
    sender = StrayCancelSender()
    producer = AsyncStubProducer(rel, sender, default_group="g")

    @idempotent_consumer(rel, group="h")
    async def handle(e: Envelope, session: AsyncSession) -> None:
        await session.execute(insert(ledger).values(message_id=e.message_id, grp="h"))
        await producer.stage(session, f"from-{e.message_id}", "orders", b"{}")

    async def scenario() -> tuple[SendOutcome, Reason]:
        async with rel.async_session() as s:  # the commit returns: the send failed, the rows stand
            await s.execute(insert(ledger).values(message_id="staged", grp="producer"))
            await producer.stage(s, "staged", "orders", b"{}")
        published = await producer.publish("published", "orders", b"{}")
        decided = await handle.decide(env("in"))
        await producer.aclose()
        await rel.aclose()
        return published.outcome, decided.reason

    assert asyncio.run(scenario()) == (SendOutcome.FAILED, Reason.PROCESSED)
    assert applied(rel) == {"staged": 1, "in": 1}
    for mid in ("staged", "published", "from-in"):
        row = stub(rel, mid)
        assert row is not None and row[:2] == ("PENDING", 1), (mid, row)
        assert "StraySendCancel" in (row[2] or ""), (mid, row)  # recorded: the sweeper re-sends it


def test_a_cancel_of_the_sending_task_still_reaches_the_caller(rel: Reliability) -> None:
    sender = StrayCancelSender()
    sender.stray, sender.hang = False, True
    producer = AsyncStubProducer(rel, sender, default_group="g")

    async def scenario() -> None:
        task = asyncio.create_task(producer.publish("cut", "orders", b"{}"))
        await asyncio.wait_for(sender.sending.wait(), 20)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await producer.aclose()
        await rel.aclose()

    asyncio.run(scenario())
    assert stub(rel, "cut") == ("PENDING", 0, None)  # committed, never sent: the sweeper's
