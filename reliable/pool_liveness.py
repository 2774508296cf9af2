"""Checking a pooled database connection before use, without a round trip when it was in use a moment ago.

Why not SQLAlchemy's ``pool_pre_ping``: it sends a ``SELECT 1`` on *every* checkout, and the guard checks a
connection out once per delivery, so the ping was one database round trip in five on a new message — paid
to learn what the operating system usually already knows. A connection the server closed (restart,
``pg_terminate_backend``, an idle timeout, a failover that kills sessions) has its socket readable at once:
the server's goodbye (PostgreSQL sends a FATAL notice, MariaDB closes) or the end of file is waiting there.
So at checkout:

* the socket has something to read (or the driver gives no socket to look at) → ping;
* the connection was last checked in more than ``idle_s`` ago → ping (what a silent network path — a
  firewall dropping an idle flow without a FIN — can only be found by);
* a connection of the pool was found dead (invalidated) within ``idle_s`` → ping: a failover or a burst of
  killed sessions ends every session at once, and a session the server is still tearing down has nothing on
  its socket yet — the guard's settle step, checked out right after its work transaction lost its session,
  got the next such connection and lost the delivery's journal row with it;
* otherwise → use it: one non-blocking ``poll`` system call, no round trip.

A ping that fails with a disconnect raises :class:`sqlalchemy.exc.DisconnectionError`, so the pool discards
the connection and checks out (or opens) another — what ``pool_pre_ping`` does. What this gives up: a
connection that dies silently (no FIN, no RST) within ``idle_s`` of its last use is found by its first
statement instead of by a ping; for the guard that statement is the opener of the work transaction, so the
delivery is answered ``database_unavailable`` and redelivered (nothing of it was committed) — the same answer
a connection dying between ping and statement got before.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import DisconnectionError

from reliable import constants as C

_LAST_USE = "reliable_last_checkin"


def install(
    engine: Engine, *, idle_s: float = C.POOL_PING_IDLE_S, clock: Callable[[], float] = time.monotonic
) -> None:
    """Check ``engine``'s connections at checkout as the module docstring says (instead of pre-ping)."""
    dialect = engine.dialect

    @event.listens_for(engine.pool, "connect")
    def _opened(dbapi_conn: Any, record: Any) -> None:
        record.info[_LAST_USE] = clock()

    @event.listens_for(engine.pool, "checkin")
    def _returned(dbapi_conn: Any, record: Any) -> None:
        if record is not None:
            record.info[_LAST_USE] = clock()

    distrust_until = 0.0  # after a connection of this pool was found dead: ping every checkout until then

    @event.listens_for(engine.pool, "invalidate")
    def _lost(dbapi_conn: Any, record: Any, exc: BaseException | None) -> None:
        nonlocal distrust_until
        distrust_until = clock() + idle_s

    @event.listens_for(engine.pool, "checkout")
    def _check(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        last = record.info.get(_LAST_USE)
        now = clock()
        if last is not None and now - last <= idle_s and now >= distrust_until and not _readable(dbapi_conn):
            return
        try:
            dialect.do_ping(dbapi_conn)
        except dialect.loaded_dbapi.Error as exc:
            if dialect.is_disconnect(exc, dbapi_conn, None):
                raise DisconnectionError(f"pooled connection found dead at checkout: {exc!r}") from exc
            raise


def socket_of(dbapi_conn: Any) -> int | None:
    """The file descriptor of a DBAPI connection's socket, if the driver is one this module knows."""
    driver = getattr(dbapi_conn, "driver_connection", dbapi_conn)  # asyncio adapters wrap the driver
    if getattr(driver, "closed", False) is True:  # psycopg 3 after close(): no socket; the ping finds out
        return None
    fileno = getattr(driver, "fileno", None)  # psycopg 3
    if callable(fileno):
        return int(fileno())
    sock = getattr(driver, "_sock", None)  # PyMySQL
    if sock is not None:
        try:
            return int(sock.fileno())
        except OSError:
            return None
    return None


def _readable(dbapi_conn: Any) -> bool:
    """True when the socket has bytes (or EOF) waiting, or when there is no socket to look at."""
    fd = socket_of(dbapi_conn)
    if fd is None or fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))
