"""How a SQLite engine is set up, sync or aiosqlite: WAL, a busy timeout, and ``BEGIN IMMEDIATE``.

SQLite has no ``SELECT … FOR UPDATE``: a transaction that reads and then writes takes the write lock only at
its first write, and two such transactions deadlock on the upgrade. Opening every transaction with
``BEGIN IMMEDIATE`` takes the lock up front. A module of its own because both engine factories use it
(:func:`reliable.facade.make_engine`, :func:`reliable.aio_backends.make_async_engine`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, event


def configure_sqlite(engine: Engine, db_url: str) -> None:
    """WAL, busy timeout and ``BEGIN IMMEDIATE`` (sync and aiosqlite engines: ``AsyncEngine.sync_engine``)."""

    @event.listens_for(engine, "connect")
    def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # the driver sends no BEGIN of its own: do_begin below does
        cur = dbapi_conn.cursor()
        if ":memory:" not in db_url and db_url.split("://", 1)[-1] not in ("", "/"):
            cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    # BEGIN IMMEDIATE in the engine dialect's do_begin, which every transaction SQLAlchemy opens on this
    # engine goes through (a Connection's, a Session's). Not an engine "begin" listener (SQLAlchemy's own
    # recipe): any engine-level listener makes SQLAlchemy dispatch events at every connect, begin, statement
    # and commit of every connection of the engine — on SQLite, where nothing waits on a network, that was
    # ≈ 15 % of the guard's CPU per new message. create_engine gives each engine a dialect of its own.
    engine.dialect.do_begin = _begin_immediate  # type: ignore[method-assign]


def _begin_immediate(dbapi_connection: Any) -> None:
    """Open a SQLite transaction that takes the write lock now (``dbapi_connection``: the pool's proxy)."""
    cur = dbapi_connection.cursor()
    try:
        cur.execute("BEGIN IMMEDIATE")
    finally:
        cur.close()
