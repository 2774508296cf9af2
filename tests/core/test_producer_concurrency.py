"""The producer next to running consumers and a small connection pool, on real databases.

What a user needs: recording a send result is bookkeeping after the caller's commit, so it must never deadlock
with the guard's transactions, never raise into the caller, and never need a second pooled connection while
the committing session still holds its first (more committers than pool slots must not hang).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from sqlalchemy import event, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from reliable import Reliability, StubProducer, idempotent_consumer, outbox
from reliable.errors import DuplicateMessageIdError
from reliable.facade import make_engine
from reliable.models import MessageStub, utcnow
from reliable.producer import SendOutcome
from reliable.producer_metrics import RECORD_FAILURES
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.types import ConsumeResult
from tests.conftest import _ensure_clean_schema
from tests.core.guard_helpers import apply, env, make_rel
from tests.core.producer.support import RecordingSender
from tests.waiting import wait_until

WAIT_S = 20.0


def lock_waiters(rel: Reliability) -> int:
    """Backends of this database waiting on a heavyweight lock (a row lock shows up as one)."""
    with rel.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def waiting(rel: Reliability, n: int) -> bool:
    return lock_waiters(rel) == n


def behind_row_a(rel: Reliability, first: Callable[[], None], second: Callable[[], None]) -> None:
    """Run ``first`` then ``second`` in threads, each queued behind a third connection holding billing's
    ``dl-a`` inbox row, then let go of it: the two meet in exactly that order."""
    with rel.engine.connect() as blocker:
        blocker.execute(
            text(
                "SELECT 1 FROM message_inbox WHERE consumer_group = 'billing' "
                "AND message_id = 'dl-a' FOR UPDATE"
            )
        )
        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for queued, thread in enumerate(threads, 1):
            thread.start()
            wait_until(partial(waiting, rel, queued), WAIT_S, f"waiter {queued} to queue behind the blocker")
        blocker.rollback()
    for thread in threads:
        thread.join(WAIT_S)


def record_failures(outcome: str) -> float:
    return float(RECORD_FAILURES.labels(outcome)._value.get())


def send_count(rel: Reliability, message_id: str) -> int:
    with rel.session() as s:
        return int(
            s.execute(select(MessageStub.send_count).where(MessageStub.message_id == message_id)).scalar_one()
        )


@pytest.fixture
def pg_rel(postgres_url: str, key_prefix: str) -> Iterator[Reliability]:
    _ensure_clean_schema(postgres_url)
    rel = make_rel(postgres_url, None, key_prefix)
    yield rel
    rel.close()


def test_recording_sends_while_a_batch_confirms_does_not_deadlock(pg_rel: Reliability) -> None:
    """The producer records sends of [b, a] (staging order) while the guard confirms the batch [a, b].

    The guard locks inbox rows in id order; if the producer's bookkeeping took them in staging order it would
    hold b and wait for a while the guard holds a and waits for b — a deadlock PostgreSQL breaks by aborting
    one side. A third connection holding a's row lines both up behind it so the interleaving is exact.
    """
    rel = pg_rel
    sender = RecordingSender()
    producer = StubProducer(rel, sender, default_group="billing")
    with rel.session() as s:
        staged = [producer.stage(s, m, "orders", b"{}", send_on_commit=False) for m in ("dl-b", "dl-a")]
    guard = idempotent_consumer(rel, group="billing")(apply)
    retried_before = record_failures("retried")

    outcome: dict[str, Any] = {}

    def consume() -> None:
        outcome["consumer"] = guard.batch([env("dl-a"), env("dl-b")])

    def record() -> None:
        try:
            outcome["producer"] = producer.send_staged(staged, verify=False)
        except Exception as exc:  # the assertion below names it
            outcome["producer"] = exc

    behind_row_a(rel, consume, record)

    assert not isinstance(outcome["producer"], Exception), outcome["producer"]
    assert [r.outcome for r in outcome["producer"]] == [SendOutcome.SENT, SendOutcome.SENT]
    assert outcome["consumer"] == [ConsumeResult.SUCCESS, ConsumeResult.SUCCESS]
    assert (send_count(rel, "dl-a"), send_count(rel, "dl-b")) == (1, 1)
    assert record_failures("retried") == retried_before  # no deadlock was broken and retried either


def test_recording_a_sweepers_targeted_resends_while_a_batch_confirms_does_not_deadlock(
    pg_rel: Reliability,
) -> None:
    """A sweeper with lease claims records its resends of [b, a] in a transaction of its own (no row locks
    held from the claim) while the guard confirms the batch [a, b]: the record must lock the inbox rows in the
    guard's order too, or it would hold b and wait for a while the guard holds a and waits for b. Lined up
    behind a third connection holding a's row, as above."""
    rel = pg_rel
    producer = StubProducer(rel, RecordingSender(), default_group="billing")
    with rel.session() as s:
        for m in ("dl-b", "dl-a"):
            producer.stage(s, m, "orders", b"{}", send_on_commit=False)
    guard = idempotent_consumer(rel, group="billing")(apply)
    now = utcnow()
    attempts = [
        (
            outbox.SendAttempt(
                OutgoingMessage(m, "orders", b"{}", None, 2, target_group="billing"),
                receipt=SendReceipt(queue_id=1, queue_offset=offset),
            ),
            now,
        )
        for m, offset in (("dl-b", 7), ("dl-a", 8))
    ]

    outcome: dict[str, Any] = {}

    def consume() -> None:
        outcome["consumer"] = guard.batch([env("dl-a"), env("dl-b")])

    def record() -> None:
        try:
            with rel.engine.begin() as conn:
                outbox.record_sends(conn, attempts, now)
            outcome["sweeper"] = "recorded"
        except Exception as exc:  # the assertion below names it
            outcome["sweeper"] = exc

    behind_row_a(rel, consume, record)

    assert outcome["sweeper"] == "recorded", outcome["sweeper"]
    assert outcome["consumer"] == [ConsumeResult.SUCCESS, ConsumeResult.SUCCESS]
    with rel.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT message_id, status, resend_count, queue_offset FROM message_inbox ORDER BY message_id"
            )
        ).all()
    assert [tuple(r) for r in rows] == [("dl-a", "CONFIRMED", 1, 8), ("dl-b", "CONFIRMED", 1, 7)]


class Fault:
    """Fault injection: the next ``times`` statements that update ``message_stub`` fail like a deadlock."""

    def __init__(self, rel: Reliability, times: int) -> None:
        self.left = times
        event.listen(rel.engine, "before_cursor_execute", self)

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if self.left and statement.lstrip().upper().startswith("UPDATE MESSAGE_STUB"):
            self.left -= 1
            raise OperationalError(statement, None, Exception("injected: deadlock detected"))


@pytest.mark.parametrize("faults", [1, 100], ids=["once", "always"])
def test_a_failure_recording_the_send_never_reaches_the_committed_caller(
    db_url: str, key_prefix: str, faults: int
) -> None:
    rel = make_rel(db_url, None, key_prefix)
    try:
        sender = RecordingSender()
        producer = StubProducer(rel, sender, default_group="billing")
        given_up = record_failures("given_up")
        Fault(rel, faults)
        with producer.transaction() as tx:  # must not raise: the business transaction has committed
            tx.session.execute(text("SELECT 1"))
            tx.stage("rec-1", "orders", b"{}")
        assert [r.outcome for r in tx.results] == [SendOutcome.SENT]
        assert [m.message_id for m in sender.sent] == ["rec-1"]
        if faults == 1:  # retried: the send is recorded
            assert send_count(rel, "rec-1") == 1
            assert record_failures("given_up") == given_up
        else:  # logged and counted; the stub stays due, so the sweeper redoes the bookkeeping
            assert send_count(rel, "rec-1") == 0
            assert record_failures("given_up") == given_up + 1
    finally:
        rel.close()


def test_more_committers_than_pool_slots_all_send(postgres_url: str) -> None:
    """Two sessions hold both pool slots and commit at once, two more wait for a slot: all four get sent.

    An after-commit send that checked out a second connection while its session still held the first would
    wait for a slot nobody releases (until the pool timeout, then the messages stay unsent).
    """
    _ensure_clean_schema(postgres_url)
    rel = Reliability(engine=make_engine(postgres_url, pool_size=2, max_overflow=0, pool_timeout=5))
    try:
        sender = RecordingSender()
        producer = StubProducer(rel, sender, default_group="billing")
        holding = threading.Barrier(2)
        flushed = threading.Semaphore(0)
        errors: list[BaseException] = []

        def commit(i: int, hold: bool) -> None:
            try:
                with rel.session() as s:
                    producer.stage(s, f"pool-{i}", "orders", b"{}")
                    s.flush()  # takes a pool slot
                    if hold:
                        flushed.release()
                        holding.wait(WAIT_S)
            except BaseException as exc:  # reported below
                errors.append(exc)

        holders = [threading.Thread(target=commit, args=(i, True)) for i in range(2)]
        waiters = [threading.Thread(target=commit, args=(i, False)) for i in range(2, 4)]
        for t in holders:
            t.start()
        for _ in holders:  # both slots taken before the others ask for one
            assert flushed.acquire(timeout=WAIT_S)
        for t in waiters:
            t.start()
        for t in holders + waiters:
            t.join(WAIT_S)
        assert errors == []
        assert sorted(m.message_id for m in sender.sent) == [f"pool-{i}" for i in range(4)]
        assert [send_count(rel, f"pool-{i}") for i in range(4)] == [1, 1, 1, 1]
    finally:
        rel.close()


@pytest.mark.parametrize(
    "backend", ["postgres", "mariadb"]
)  # SQLite: the first stage's lookup takes the lock
def test_two_transactions_staging_one_id_at_once_the_second_commit_gets_a_typed_error(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """Both pass the lookup for an existing stub before either commits; the database's unique key refuses
    the second commit. The caller gets the error a later stage of that id gets (``DuplicateMessageIdError``,
    the driver's unique-key error as its cause), nothing of its transaction is kept, and the first
    message goes out once."""
    url: str = request.getfixturevalue(f"{backend}_url")
    _ensure_clean_schema(url)
    with Reliability(url) as rel:
        sender = RecordingSender()
        producer = StubProducer(rel, sender, default_group="billing")
        refused = pytest.raises(DuplicateMessageIdError, match="staged by another transaction")
        with refused as info, rel.session() as first:
            producer.stage(first, "order-7", "orders", b"first")
            with rel.session() as second:  # another request, committing in between
                producer.stage(second, "order-7", "orders", b"second")
        assert isinstance(info.value.__cause__, IntegrityError)
        with rel.session() as s:
            assert s.scalars(select(MessageStub.content)).all() == [b"second"]
        assert [m.body for m in sender.sent] == [b"second"]


@pytest.mark.parametrize("backend", ["postgres", "mariadb"])
def test_the_same_race_through_an_async_session_gets_the_same_typed_error(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """``rel.async_session()`` is what the async producer's docs show; its lost race was a raw
    ``IntegrityError`` (a caller's ``except DuplicateMessageIdError`` missed it)."""
    from reliable.aio_producer import AsyncStubProducer

    url: str = request.getfixturevalue(f"{backend}_url")
    _ensure_clean_schema(url)
    with Reliability(url) as rel:
        producer = AsyncStubProducer(rel, _AsyncRecording(), default_group="billing")

        async def scenario() -> BaseException | None:
            try:
                async with rel.async_session() as first:
                    await producer.stage(first, "order-8", "orders", b"first")
                    async with rel.async_session() as second:
                        await producer.stage(second, "order-8", "orders", b"second")
            except DuplicateMessageIdError as exc:
                return exc
            finally:
                await producer.aclose()
                await rel.aclose()
            return None

        refused = asyncio.run(scenario())
        assert refused is not None and "staged by another transaction" in str(refused)
        assert isinstance(refused.__cause__, IntegrityError)


class _AsyncRecording:
    """An in-process :class:`~reliable.sender.AsyncSender` (the broker side is tested in tests/adapters)."""

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        return SendReceipt(0, 1, message.message_id)


def test_one_id_staged_twice_in_one_transaction_without_autoflush_is_a_typed_error(sqlite_url: str) -> None:
    """With ``autoflush=False`` the first stub is not flushed when the second stage looks it up: both were
    added, and the commit failed on the unique key, untyped."""
    _ensure_clean_schema(sqlite_url)
    with Reliability(sqlite_url) as rel:
        producer = StubProducer(rel, RecordingSender(), default_group="billing")
        with Session(rel.engine, autoflush=False) as s, s.begin():
            producer.stage(s, "twice", "orders", b"1")
            with pytest.raises(DuplicateMessageIdError, match="staged twice in one transaction"):
                producer.stage(s, "twice", "orders", b"1")
