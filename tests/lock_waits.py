"""Who waits for whom on the database server: the waits a test synchronises on, named by session.

Why not a count of waiting sessions: a count sees every lock wait on the server (or on the database) — another
pytest process, a benchmark, the test's own other connection — so a test that proceeds once "someone waits"
may proceed before the session it means has reached its statement, and the interleaving it builds is not
the one it asserts on. These helpers ask about one session: is *this* backend blocked by *that* one.

PostgreSQL: ``pg_blocking_pids``. MariaDB/MySQL: the server's processlist row of one connection id (InnoDB's
own lock-wait tables are refreshed from a cache and miss a wait that starts while a statement is still being
planned, so they would make the poll slower, not more precise).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Collection
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, event, text

#: PostgreSQL's SQLSTATE for a transaction rolled back to break a deadlock
PG_DEADLOCK_DETECTED = "40P01"


def session_id(conn: Connection) -> int:
    """The server's id of ``conn``'s session: the backend pid (PostgreSQL) or the connection id (MariaDB)."""
    sql = "SELECT pg_backend_pid()" if conn.dialect.name == "postgresql" else "SELECT CONNECTION_ID()"
    return int(conn.execute(text(sql)).scalar_one())


def pg_blocked_by(engine: Engine, waiters: Collection[int], blockers: Collection[int]) -> bool:
    """Whether one of the PostgreSQL backends ``waiters`` is waiting for a lock that one of ``blockers``
    holds (or queues ahead for)."""
    sql = (
        "SELECT EXISTS (SELECT 1 FROM unnest(CAST(:w AS int[])) AS w(pid) "
        "WHERE pg_blocking_pids(w.pid) && CAST(:b AS int[]))"
    )
    with engine.connect() as conn:
        return bool(conn.execute(text(sql), {"w": list(waiters), "b": list(blockers)}).scalar_one())


def pg_checks_for_deadlocks_last(conn: Connection) -> None:
    """PostgreSQL breaks a deadlock in the session whose ``deadlock_timeout`` runs out first: normally the
    one that began to wait first, but a session that began a few milliseconds later can run its check first
    on a loaded machine and be rolled back instead. A test's own transaction that closes a deadlock checks
    only after 30 s (the guard's session keeps the server's 1 s), so the session it means is the victim.
    Needs a superuser (the tests' ``postgres``)."""
    conn.execute(text("SET LOCAL deadlock_timeout = '30s'"))


def pg_waiting(engine: Engine, waiters: Collection[int]) -> bool:
    """Whether one of the PostgreSQL backends ``waiters`` is waiting for a heavyweight lock (a row, a table,
    a transaction), whoever holds it."""
    sql = "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = ANY(:w) AND wait_event_type = 'Lock')"
    with engine.connect() as conn:
        return bool(conn.execute(text(sql), {"w": list(waiters)}).scalar_one())


def mysql_waiting(engine: Engine, waiters: Collection[int], statement: str) -> bool:
    """Whether one of the MariaDB connections ``waiters`` has been running a statement ``LIKE statement``
    for over 100 ms (waiting: the statements these tests wait on finish at once when not blocked)."""
    sql = (
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID IN :w AND COMMAND = 'Query' "
        "AND TIME_MS > 100 AND INFO LIKE :q"
    )
    query = text(sql).bindparams(bindparam("w", expanding=True))
    with engine.connect() as conn:
        return bool(conn.execute(query, {"w": list(waiters), "q": statement}).scalar_one())


def waiting(engine: Engine, waiters: Collection[int], statement: str = "%") -> bool:
    """Whether one of the sessions ``waiters`` waits for a lock, on either server: :func:`pg_waiting` on
    PostgreSQL (whatever it runs), :func:`mysql_waiting` on MariaDB (a statement ``LIKE statement``)."""
    if not waiters:
        return False
    if engine.dialect.name == "postgresql":
        return pg_waiting(engine, waiters)
    return mysql_waiting(engine, waiters, statement)


class ThreadSessions:
    """The server session ids of the connections that threads of the given names check out of ``engine``
    (the guard's own connections, which a test cannot reach). Read without a round trip where the driver
    knows it (psycopg); pymysql's ``thread_id()`` is the connection id the server reported at connect."""

    def __init__(self, engine: Engine, *thread_names: str) -> None:
        self.engine = engine
        self.names = set(thread_names)
        self.ids: set[int] = set()
        self._lock = threading.Lock()
        event.listen(engine, "checkout", self._checkout)

    def _checkout(self, dbapi_conn: Any, record: Any, proxy: Any) -> None:
        if threading.current_thread().name not in self.names:
            return
        if self.engine.dialect.name == "postgresql":
            sid = dbapi_conn.info.backend_pid
        else:
            sid = dbapi_conn.thread_id()
        with self._lock:
            self.ids.add(int(sid))

    def snapshot(self) -> set[int]:
        with self._lock:
            return set(self.ids)

    def close(self) -> None:
        event.remove(self.engine, "checkout", self._checkout)


class HoldAfterDeadlock:
    """Holds a thread that the database chose as a deadlock victim until the test says go.

    Once the victim's transaction is rolled back its row locks go, and the guard runs its transaction again
    at once: its rerun and the test's transaction, which was waiting for a row the victim held, race for
    that row. A rerun that wins it then waits for the test's other row — a second deadlock the test did not
    build. So the thread's next ``begin`` after a rollback caused by a deadlock (SQLAlchemy's events; the
    server keeps an aborted transaction's locks until its ``ROLLBACK``, sent between the two) waits until
    the test's statement has its row. The guard sends its statements through the driver's cursor, past
    ``handle_error``: the ``rollback`` event reads the error from ``sys.exc_info()`` (the ``with
    conn.begin()`` block is unwinding with it)."""

    def __init__(self, engine: Engine, thread_name: str, timeout: float = 30.0) -> None:
        self.engine = engine
        self.thread_name = thread_name
        self.timeout = timeout
        self.go = threading.Event()
        self.held = 0
        self.timed_out = False
        self._victim = False
        event.listen(engine, "rollback", self._on_rollback)
        event.listen(engine, "begin", self._on_begin)

    def _on_rollback(self, conn: Connection) -> None:
        if threading.current_thread().name == self.thread_name and _deadlock_in(sys.exc_info()[1]):
            self._victim = True

    def _on_begin(self, conn: Connection) -> None:
        if threading.current_thread().name != self.thread_name or not self._victim:
            return
        self._victim = False
        self.held += 1
        if not self.go.wait(self.timeout):
            self.timed_out = True  # the test asserts on it; the guard goes on as the deadlock left it

    def close(self) -> None:
        event.remove(self.engine, "rollback", self._on_rollback)
        event.remove(self.engine, "begin", self._on_begin)


def _deadlock_in(exc: BaseException | None) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if getattr(getattr(exc, "orig", exc), "sqlstate", None) == PG_DEADLOCK_DETECTED:
            return True
        exc = exc.__cause__ or exc.__context__
    return False
