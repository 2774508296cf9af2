"""MariaDB/MySQL over asyncmy: a statement cut off by a task's cancel is ended on the server too.

Why: asyncmy answers a cancel that lands mid-statement by closing its socket, nothing more. The server's
thread goes on running the statement — a ``SLEEP`` for up to 5 s, a row-lock wait up to
``innodb_lock_wait_timeout`` (50 s), a long query to its end — and keeps its transaction's row locks
meanwhile. The guard's settle step, which counts the cancelled handler's attempt on a fresh connection,
waited for those locks, so ``asyncio.timeout(1)`` around a guarded handler returned after 50 s; and every
other delivery of that message (and anything touching the rows the handler wrote) waited with it.
PostgreSQL needs nothing of this: psycopg sends the server a cancel request itself when its task is cancelled.

So each asyncio engine on asyncmy (:func:`reliable.aio_backends.make_async_engine`) ends the server thread of
a connection invalidated because of a cancel: ``KILL <thread id>`` from a short connection of its own,
before the pool closes the dead one. ``KILL`` rather than ``KILL QUERY``: the client side is already gone,
and ending the thread rolls its transaction back — the locks are what matter — without waiting for the
thread to notice the closed socket. The thread id comes from the connection's handshake (no round trip).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.util import await_only
from sqlalchemy.util.concurrency import in_greenlet

from reliable.guard.db_errors import own_cancel_in

log = logging.getLogger("reliable.aio")

#: MariaDB/MySQL: ``KILL`` of a thread that has ended meanwhile (the statement finished before the kill)
_ER_NO_SUCH_THREAD = 1094
#: asyncmy's close reason (and ``InterfaceError`` text) for a connection it closed because of a cancel
ASYNCMY_CANCEL_REASON = "Cancelled during execution"
#: seconds the kill may take in all — connect, handshake, ``KILL``: a server that does not answer is an
#: outage, not a dead statement, and the cancelled caller (an ``asyncio.timeout`` around the work) waits
#: for it. asyncmy's ``connect_timeout`` covers the TCP connect alone: a frozen server (SIGSTOP, a paused
#: VM) accepts it and never sends its handshake, and the kill waited for ever (the review of 2026-11-29)
KILL_TIMEOUT_S = 2.0


def install(engine: AsyncEngine) -> None:
    """Kill the server thread of each of ``engine``'s connections discarded because of a cancel (asyncmy)."""
    if engine.dialect.driver != "asyncmy":
        return
    _, params = engine.dialect.create_connect_args(engine.url)
    params = {**params, "connect_timeout": KILL_TIMEOUT_S}

    def on_invalidate(dbapi_connection: Any, record: ConnectionPoolEntry, exc: BaseException | None) -> None:
        if not _cut_off_by_cancel(dbapi_connection, exc):
            return  # dropped for another reason (a lost server, a caller's invalidate): nothing runs there
        thread_id = _thread_id(dbapi_connection)
        if thread_id is None:
            return
        if not in_greenlet():  # outside the asyncio bridge no await is possible; the server ends it alone
            log.warning("cancelled statement of MariaDB thread %d left running (not on the loop)", thread_id)
            return
        await_only(_kill(params, thread_id))

    event.listen(engine.sync_engine, "invalidate", on_invalidate)


def _cut_off_by_cancel(dbapi_connection: Any, exc: BaseException | None) -> bool:
    """Whether a cancel closed the connection mid-statement. The cancel itself is in ``exc``'s chain when
    it landed in a statement SQLAlchemy ran; when it landed in one of the guard's own cursor calls
    (:mod:`reliable.stores.sql_runner`) the connection is dropped later, on asyncmy's error for the next
    command ("Cancelled during execution"), which asyncmy also keeps as the connection's close reason.

    Only then: after a lost server, a thread id may belong to another client of the restarted one."""
    if exc is not None and own_cancel_in(exc):
        return True
    driver = getattr(dbapi_connection, "driver_connection", None)
    return getattr(driver, "_close_reason", None) == ASYNCMY_CANCEL_REASON


def _thread_id(dbapi_connection: Any) -> int | None:
    """The server thread of an asyncmy connection (SQLAlchemy's adapter around it), if it got that far."""
    driver = getattr(dbapi_connection, "driver_connection", None)
    thread_id = getattr(driver, "thread_id", None)
    if thread_id is None:
        return None
    try:
        return int(thread_id())
    except TypeError:  # no handshake yet: no server thread to end
        return None


async def _kill(params: dict[str, Any], thread_id: int, timeout_s: float = KILL_TIMEOUT_S) -> None:
    """``KILL thread_id`` on a connection of its own, within ``timeout_s`` in all; a failure is logged (the
    server ends the statement in time)."""
    import asyncmy
    from asyncmy.errors import Error

    conn: Any = None
    try:
        async with asyncio.timeout(timeout_s):
            conn = await asyncmy.connect(**params)
            async with conn.cursor() as cur:
                await cur.execute(f"KILL {int(thread_id)}")
    except TimeoutError:
        log.warning(
            "could not end the cancelled statement of MariaDB thread %d: the server did not answer in %.1f s",
            thread_id,
            timeout_s,
        )
    except Error as exc:
        if exc.args and exc.args[0] == _ER_NO_SUCH_THREAD:
            return  # the statement ended on its own before the kill
        log.warning("could not end the cancelled statement of MariaDB thread %d: %r", thread_id, exc)
    except OSError as exc:
        log.warning("could not end the cancelled statement of MariaDB thread %d: %r", thread_id, exc)
    finally:
        if conn is not None:
            conn.close()  # no goodbye to a server that may not answer: the socket is closed at once
