"""A caller's cancel of a guarded handler mid-statement ends the statement on the server too.

Why: asyncmy (MariaDB) answers a cancel by closing its socket; the server's thread kept waiting — a row-lock
wait until ``innodb_lock_wait_timeout``, 50 s — and kept the locks of the handler's transaction. The guard's
own settle step (counting the attempt) waited for them, so the cancelled call returned after 50 s instead of
at once, and a redelivery of the message waited on its dead predecessor. psycopg cancels on the server
itself; the test holds PostgreSQL to the same promise.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import insert, make_url, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from reliable import Envelope, Reliability, idempotent_consumer, server_cancel
from reliable.aio_backends import make_async_engine
from reliable.guard import Reason
from tests.aio.flavours import applied, env, inbox, ledger, make_rel
from tests.freezing_proxy import FreezingProxy
from tests.waiting import wait_until

MARK = "cancelled-handler-statement"
#: sessions of this database (other than the asking one) running a statement that starts ``LIKE`` pattern
RUNNING = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND datname = "
    "current_database() AND pid <> pg_backend_pid() AND query LIKE :pattern",
    "mysql": "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() "
    "AND id <> CONNECTION_ID() AND info LIKE :pattern",
}


@pytest.fixture
def rel(server_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    r = make_rel(server_url, redis_url, key_prefix, max_attempts=5)
    yield r
    r.close()


def running(rel: Reliability, pattern: str = f"%{MARK}%") -> int:
    with rel.engine.connect() as conn:
        return int(conn.execute(text(RUNNING[rel.engine.dialect.name]), {"pattern": pattern}).scalar_one())


def test_a_cancelled_handler_statement_stops_on_the_server_and_the_redelivery_does_not_wait_for_it(
    rel: Reliability,
) -> None:
    with rel.engine.begin() as conn:
        held = conn.execute(insert(ledger).values(message_id="held", grp="other")).inserted_primary_key
    assert held is not None
    held_id = held[0]
    entered = asyncio.Event()

    @idempotent_consumer(rel, group="g")
    async def handle(e: Envelope, session: AsyncSession) -> None:
        await session.execute(insert(ledger).values(message_id=e.message_id, grp="g"))
        if e.reconsume_times == 0:  # the first delivery waits for a row another transaction holds
            entered.set()
            wait = select(ledger.c.id).where(ledger.c.id == held_id).with_for_update()
            await session.execute(wait.prefix_with(f"/* {MARK} */"))

    mid = f"m-{uuid.uuid4().hex[:8]}"

    async def scenario() -> tuple[float, Reason, float]:
        task = asyncio.create_task(handle.decide(env(mid)))
        await asyncio.wait_for(entered.wait(), 20)
        await asyncio.to_thread(wait_until, lambda: running(rel), 20, "the handler's lock wait on the server")
        cancelled_at = time.monotonic()
        task.cancel()  # as the caller's asyncio.timeout does when it runs out
        with pytest.raises(asyncio.CancelledError):
            await task
        unwound = time.monotonic() - cancelled_at
        await asyncio.to_thread(wait_until, lambda: not running(rel), 5, "the cancelled statement to end")
        start = time.monotonic()
        again = await asyncio.wait_for(handle.decide(env(mid, reconsume_times=1)), 20)
        took = time.monotonic() - start
        await rel.aclose()
        return unwound, again.reason, took

    with rel.engine.connect() as blocker:  # holds the row for the whole scenario: only a kill ends the wait
        blocker.execute(select(ledger.c.id).where(ledger.c.id == held_id).with_for_update())
        unwound, reason, took = asyncio.run(scenario())
        blocker.rollback()
    assert unwound < 3, f"the cancelled call returned after {unwound:.1f} s (it waited on its own statement)"
    assert (reason, took < 3) == (Reason.PROCESSED, True), (reason, took)
    assert inbox(rel, mid) == ("CONFIRMED", 1)  # the cancelled attempt counted, the redelivery applied
    assert applied(rel, "g") == {mid: 1}


def test_a_cancel_in_the_guards_own_statement_stops_it_on_the_server(rel: Reliability) -> None:
    """The cancel lands while the guard's own confirmation waits for the inbox row (another worker holds it):
    that statement goes through the driver's cursor, and asyncmy drops the connection only at the next
    command. The server's wait must end all the same, not hold the journal row's locks for 50 s."""

    @idempotent_consumer(rel, group="g")
    async def handle(e: Envelope, session: AsyncSession) -> None:
        await session.execute(insert(ledger).values(message_id=e.message_id, grp="g"))
        if e.reconsume_times == 0:
            raise RuntimeError("the first attempt fails: the inbox row stays PENDING")

    mid = f"m-{uuid.uuid4().hex[:8]}"
    confirming = "%message_inbox%"  # its statement on the row (the blocker is idle: not listed)

    async def scenario(first: bool) -> None:
        if first:
            assert (await handle.decide(env(mid))).reason is Reason.HANDLER_FAILED
        else:
            task = asyncio.create_task(handle.decide(env(mid, reconsume_times=1)))
            await asyncio.to_thread(wait_until, lambda: running(rel, confirming), 20, "the guard's lock wait")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.to_thread(wait_until, lambda: not running(rel, confirming), 5, "its end")
        await rel.aclose()

    asyncio.run(scenario(first=True))
    with rel.engine.connect() as blocker:  # another worker's transaction on the message's inbox row
        blocker.execute(text("SELECT * FROM message_inbox WHERE message_id = :m FOR UPDATE"), {"m": mid})
        asyncio.run(scenario(first=False))
        blocker.rollback()
    assert inbox(rel, mid) == ("PENDING", 1)


def test_a_cancel_while_the_server_hangs_returns_within_the_kills_own_bound(mariadb_url: str) -> None:
    """A server that stops answering (SIGSTOP, a paused VM) is when users put ``asyncio.timeout`` around
    their work. The kill that ends a cancelled statement connects to that same server: its TCP connect
    succeeds and the greeting never comes — the cancelled caller waited for ever (asyncmy's
    ``connect_timeout`` covers the connect alone). The whole kill is bounded now."""
    proxy = FreezingProxy(("127.0.0.1", make_url(mariadb_url).port or 3306))
    url = make_url(mariadb_url).set(drivername="mysql+asyncmy", host="127.0.0.1", port=proxy.port)
    engine = make_async_engine(url)

    async def cancelled_while_frozen() -> float:
        async with engine.connect() as conn:  # a pooled connection that worked
            assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
        proxy.freeze()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1), engine.connect() as conn:
                await conn.execute(text("SELECT 2"))
        return time.monotonic() - started

    try:
        # liveness, not speed: without the bound the cancelled call never came back
        elapsed = asyncio.run(asyncio.wait_for(cancelled_while_frozen(), 60))
        assert elapsed < 1 + server_cancel.KILL_TIMEOUT_S + 5
    finally:
        proxy.close()
        asyncio.run(engine.dispose(close=False))
