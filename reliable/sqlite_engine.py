"""How a SQLite engine is set up, sync or aiosqlite: WAL, a busy timeout, and ``BEGIN IMMEDIATE``.

SQLite has no ``SELECT … FOR UPDATE``: a transaction that reads and then writes takes the write lock only at
its first write, and two such transactions deadlock on the upgrade. Opening every transaction with
``BEGIN IMMEDIATE`` takes the lock up front. A module of its own because both engine factories use it
(:func:`reliable.facade.make_engine`, :func:`reliable.aio_backends.make_async_engine`).

An aiosqlite connection is rolled back before SQLAlchemy closes it as invalid (:func:`_roll_back_invalid`):
a statement cut off by a cancel leaves its cursor open, and ``sqlite3``'s ``close()`` then leaves the
connection alive as SQLite's "zombie" until that cursor is freed — with its transaction and the file's write
lock, which the guard (``BEGIN IMMEDIATE``) holds from its first statement.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import Engine, event

log = logging.getLogger("reliable")


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
    if engine.dialect.driver == "aiosqlite":  # a pool event: dispatched only when a connection is invalidated
        event.listen(engine.pool, "invalidate", _roll_back_invalid)


def _roll_back_invalid(dbapi_conn: Any, _record: Any, exc: BaseException | None) -> None:
    """End the transaction of an aiosqlite connection SQLAlchemy is about to close as invalid.

    SQLAlchemy invalidates the connection whenever a cancel lands in a statement (a handler's query cut off
    by the caller's ``wait_for``). aiosqlite's thread runs the statement to its first row regardless, and its
    cursor — referenced from the cancel's traceback, freed only by the garbage collector — keeps the closed
    connection alive with the guard's transaction: the file stayed write-locked, the guard's settle step
    waited out the 30 s busy timeout and failed, and every other writer with it (until 2026-11-28). A
    ``ROLLBACK`` first aborts that statement and releases the lock; the close that follows is unchanged."""
    if dbapi_conn is None:
        return
    try:
        dbapi_conn.rollback()
    except Exception as err:  # the connection is being discarded anyway; its close goes ahead
        log.warning("rolling back an invalidated SQLite connection failed (after %r): %r", exc, err)


def _begin_immediate(dbapi_connection: Any) -> None:
    """Open a SQLite transaction that takes the write lock now (``dbapi_connection``: the pool's proxy)."""
    cur = dbapi_connection.cursor()
    try:
        cur.execute("BEGIN IMMEDIATE")
    finally:
        cur.close()
