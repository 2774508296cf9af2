"""SQLite: every transaction on the engine takes the write lock at once (``BEGIN IMMEDIATE``), with no engine
event that every statement of every connection would pay for; timestamps bound as SQLAlchemy writes them.

What a user needs: two workers on one SQLite file never deadlock on a read-then-write lock upgrade (the
guard's inbox read has no ``FOR UPDATE`` there), and the guard's text timestamps compare correctly with the
ones SQLAlchemy's ``DateTime`` writes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session

from reliable import Reliability, idempotent_consumer
from reliable.guard.decision import Reason
from reliable.stores import pg_pipeline
from reliable.stores.sql_text import ts_converter
from tests.core.guard_helpers import CONNECTION_EVENTS, applied, apply, env


def write_locked(path: str) -> bool:
    """Whether another connection to ``path`` is refused the write lock right now."""
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        assert "locked" in str(exc)
        return True
    finally:
        other.close()  # a transaction it did open is rolled back with it
    return False


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_transactions_take_the_write_lock_at_begin_without_an_engine_event(rel: Reliability) -> None:
    handle = idempotent_consumer(rel, group="bi", registry=CollectorRegistry())(apply)
    mid = f"bi-{uuid.uuid4().hex[:8]}"
    assert handle.decide(env(mid)).reason is Reason.PROCESSED
    assert applied(rel, mid) == 1
    assert [name for name in CONNECTION_EVENTS if getattr(rel.engine.dispatch, name)] == []
    path = rel.engine.url.database
    assert path is not None
    assert not write_locked(path)
    with rel.engine.connect() as conn, conn.begin():  # no statement yet: the lock is taken by BEGIN
        assert write_locked(path)
    assert not write_locked(path)
    with Session(rel.engine) as session, session.begin():
        session.connection()
        assert write_locked(path)
    handle.close()


def test_sqlite_timestamps_are_the_text_sqlalchemy_writes_and_each_value_its_own() -> None:
    convert = ts_converter("sqlite")
    plus2 = dt.timezone(dt.timedelta(hours=2))
    values = [
        dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),  # no microseconds: still written
        dt.datetime(2026, 1, 2, 3, 4, 5, 7, tzinfo=plus2),
        dt.datetime.now(dt.UTC),
    ]
    for _ in range(2):  # alternating values, each converted again and again: never another's text
        for t in values:
            assert convert(t) == convert(t) == t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    equal_but_not_same = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert convert(equal_but_not_same) == "2026-01-02 03:04:05.000000"


def test_postgres_timestamp_parameters_are_each_value_its_own() -> None:
    a = dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    b = dt.datetime(2026, 1, 2, 3, 4, 5, 7, tzinfo=dt.UTC)
    for _ in range(2):
        assert pg_pipeline.as_text(a) == pg_pipeline.as_text(a) == b"2026-01-02T03:04:05.000006+00:00"
        assert pg_pipeline.as_text(b) == b"2026-01-02T03:04:05.000007+00:00"
    with pytest.raises(TypeError, match="naive"):
        pg_pipeline.as_text(dt.datetime(2026, 1, 2))


def test_the_asyncio_engine_takes_the_write_lock_at_begin_too(tmp_path: Path) -> None:
    from reliable.aio_backends import make_async_engine

    path = str(tmp_path / "aio.db")
    engine = make_async_engine(f"sqlite:///{path}")

    async def run() -> None:
        async with engine.connect() as conn, conn.begin():
            assert write_locked(path)
        assert not write_locked(path)
        await engine.dispose()

    asyncio.run(run())
    assert not engine.sync_engine.dispatch.begin
