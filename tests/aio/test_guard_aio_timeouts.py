"""A caller's timeout that cuts off the handler's own database statement (``asyncio.wait_for``, a shutdown).

Why a file of its own: that cancel reaches the guard through the driver, not as a plain ``CancelledError`` —
SQLAlchemy invalidates the connection whatever the cancel interrupts, asyncmy turns it into an error of its
own, aiosqlite leaves the cursor it was running. The guard took that for a database outage (no attempt
counted: a poison message whose query always outlasts the timeout was retried for ever, never dead-lettered,
nobody told), and on SQLite the cut-off cursor kept the file write-locked until garbage collection.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, insert, text
from sqlalchemy.ext.asyncio import AsyncSession

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.guard import Decision, Reason
from tests.aio.flavours import applied, env, inbox, journal, ledger, make_rel
from tests.conftest import _ensure_clean_schema


class SlowStatement:
    """A statement still running when the caller gives up; ``started()`` returns once it runs.

    PostgreSQL and MariaDB sleep long (psycopg cancels the statement on the server; asyncmy only closes its
    socket, and reliable.server_cancel kills the server thread). SQLite runs ``held()``, a function of the
    test's that waits in aiosqlite's thread until the cancel has been delivered: the cursor it leaves with a
    row to fetch is what held the file's lock."""

    def __init__(self, rel: Reliability) -> None:
        self.sqlite = rel.engine.dialect.name == "sqlite"
        sql = {"postgresql": "SELECT pg_sleep(30)", "mysql": "SELECT SLEEP(30)", "sqlite": "SELECT held()"}
        self.sql = text(sql[rel.engine.dialect.name])
        self.entered = asyncio.Event()
        self.budget: asyncio.Timeout | None = None
        self.running, self.release = threading.Event(), threading.Event()

    def install(self, rel: Reliability) -> None:
        """On the running loop, before its first delivery: every new aiosqlite connection gets ``held()``."""
        if self.sqlite:
            event.listen(rel.aio.engine().sync_engine, "connect", self._create_function)

    def _create_function(self, dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.create_function("held", 0, self._held)

    def _held(self) -> int:
        self.running.set()
        self.release.wait(20)
        return 1

    async def started(self) -> None:
        if self.sqlite:
            assert await asyncio.to_thread(self.running.wait, 20), "the statement never ran"
        else:
            await asyncio.wait_for(self.entered.wait(), 20)


@pytest.fixture
def rel(db_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    r = make_rel(db_url, redis_url, key_prefix, max_attempts=3)
    yield r
    r.close()


def _slow_handler(rel: Reliability, slow: SlowStatement) -> Any:
    @idempotent_consumer(rel, group="g")
    async def handle(e: Envelope, session: AsyncSession) -> None:
        await session.execute(insert(ledger).values(message_id=e.message_id, grp="g"))
        if e.message_id == "fails":
            raise RuntimeError("an ordinary handler failure")
        if e.message_id == "own-timeout":
            async with asyncio.timeout(None) as budget:  # the handler's own budget for its statement
                slow.budget = budget
                slow.entered.set()
                await session.execute(slow.sql)
        if e.message_id in ("poison", "tidy"):
            slow.entered.set()
            try:
                await session.execute(slow.sql)  # the next await: the caller's cancel lands in this statement
            except asyncio.CancelledError:
                if e.message_id == "tidy":  # notes its cancel on the connection the cancel invalidated
                    await session.execute(insert(ledger).values(message_id="cancelled", grp="g"))
                raise

    return handle


async def _timed_out(handle: Any, e: Envelope | list[Envelope], slow: SlowStatement) -> None:
    """Deliver ``e`` and cancel it while its handler's statement runs, as ``wait_for`` does when its timeout
    runs out (cancelled at that point exactly, not after a guessed delay)."""
    slow.entered.clear()
    slow.running.clear()
    slow.release.clear()
    task = asyncio.create_task(handle.decide_batch(e) if isinstance(e, list) else handle.decide(e))
    await slow.started()
    task.cancel()  # the future the task awaits is cancelled here and now, before the statement can end
    slow.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_handler_whose_statement_outlasts_the_callers_timeout_is_counted_then_dead_lettered(
    rel: Reliability,
) -> None:
    slow = SlowStatement(rel)
    handle = _slow_handler(rel, slow)

    async def scenario() -> Decision:
        slow.install(rel)
        for n in range(3):
            await _timed_out(handle, env("poison", reconsume_times=n), slow)
            assert inbox(rel, "poison") == ("PENDING" if n < 2 else "DEAD", n + 1)
        after: Decision = await handle.decide(env("poison", reconsume_times=3))
        await rel.aclose()
        return after

    assert asyncio.run(scenario()).reason is Reason.GAVE_UP
    assert applied(rel) == {}
    rows = journal(rel, "poison")
    assert [o for o, _ in rows] == ["RETRY", "RETRY", "DEAD_LETTER", "DEAD_LETTER"], rows
    reasons = [r or "" for _, r in rows]
    assert all(r.startswith("handler_failed: attempt") for r in reasons[:2]), reasons
    assert reasons[2].startswith("max_attempts: attempt 3/3") and "HandlerCancelled" in reasons[2], reasons


def test_a_timeout_in_a_batch_that_already_runs_with_savepoints_fails_only_its_own_message(
    rel: Reliability,
) -> None:
    """A batch whose first handler failed runs the rest again with a savepoint each; a cancel landing in a
    later handler's statement takes the whole transaction with the connection. Rolling back to the savepoint
    failed (the rest were answered ``database_unavailable``): the others run again on a new connection."""
    slow = SlowStatement(rel)
    handle = _slow_handler(rel, slow)

    async def scenario() -> None:
        slow.install(rel)
        await _timed_out(handle, [env("fails"), env("poison"), env("fine")], slow)
        await rel.aclose()

    asyncio.run(scenario())
    assert (inbox(rel, "fails"), inbox(rel, "poison"), inbox(rel, "fine")) == (
        ("PENDING", 1),
        ("PENDING", 1),
        ("CONFIRMED", 0),
    )
    assert applied(rel) == {"fine": 1}
    assert [o for o, _ in journal(rel, "fine")] == ["SUCCESS"]


def test_a_cancel_that_comes_out_of_the_handler_as_another_error_is_still_its_cancel(
    rel: Reliability,
) -> None:
    """The handler tidies up after the cancel with one more statement, on the connection the cancel
    invalidated: what comes out is SQLAlchemy's error, not ``CancelledError`` (so would a driver's that
    turns the cancel into an error of its own). The task's cancel count has risen: a handler cancel, counted,
    not a database outage redelivered for ever."""
    slow = SlowStatement(rel)
    handle = _slow_handler(rel, slow)

    async def scenario() -> None:
        slow.install(rel)
        await _timed_out(handle, env("tidy"), slow)
        await rel.aclose()

    asyncio.run(scenario())
    assert inbox(rel, "tidy") == ("PENDING", 1)
    assert applied(rel) == {}
    rows = journal(rel, "tidy")
    assert len(rows) == 1 and (rows[0][1] or "").startswith(
        "handler_failed: attempt 1/3: HandlerCancelled"
    ), rows


def test_sqlite_a_statement_cut_off_by_a_timeout_leaves_the_database_writable(
    sqlite_url: str, redis_url: str, key_prefix: str
) -> None:
    """The cancelled statement's cursor was kept alive by the error's traceback until garbage collection:
    the guard's own settle step waited out SQLite's busy timeout (30 s) and failed, and so did every other
    writer. Now the next delivery is processed at once."""
    _ensure_clean_schema(sqlite_url)
    rel = make_rel(sqlite_url, redis_url, key_prefix, max_attempts=3)
    slow = SlowStatement(rel)
    handle = _slow_handler(rel, slow)

    async def scenario() -> tuple[Decision, float]:
        slow.install(rel)
        await asyncio.wait_for(_timed_out(handle, env("poison"), slow), 10)
        start = time.monotonic()
        nxt: Decision = await handle.decide(env("next"))
        took = time.monotonic() - start
        await rel.aclose()
        return nxt, took

    try:
        nxt, took = asyncio.run(scenario())
        assert nxt.reason is Reason.PROCESSED and took < 5, (nxt, took)
        assert inbox(rel, "poison") == ("PENDING", 1)
        assert [o for o, _ in journal(rel, "poison")] == ["RETRY"]
        assert applied(rel) == {"next": 1}
    finally:
        rel.close()


def test_a_handler_whose_own_timeout_cuts_off_its_statement_has_failed(rel: Reliability) -> None:
    """The handler bounds its own statement (``asyncio.timeout``) and the bound runs out: its ``TimeoutError``
    is the handler's failure, counted like any other. The cancel invalidated the connection, and the guard
    took that for a database outage: no attempt counted, a handler whose query always outlasts its own
    bound retried for ever, never dead-lettered, nobody told."""
    slow = SlowStatement(rel)
    handle = _slow_handler(rel, slow)

    async def scenario() -> list[Decision]:
        slow.install(rel)
        out: list[Decision] = []
        for n in range(3):
            slow.entered.clear()
            slow.running.clear()
            slow.release.clear()
            task = asyncio.create_task(handle.decide(env("own-timeout", reconsume_times=n)))
            await slow.started()
            assert slow.budget is not None
            slow.budget.reschedule(asyncio.get_running_loop().time())  # its bound runs out now
            slow.release.set()
            out.append(await task)
        await rel.aclose()
        return out

    decisions = asyncio.run(scenario())
    assert [d.reason for d in decisions] == [
        Reason.HANDLER_FAILED,
        Reason.HANDLER_FAILED,
        Reason.MAX_ATTEMPTS,
    ]
    assert inbox(rel, "own-timeout") == ("DEAD", 3)
    assert applied(rel) == {}
