"""One URL, two flavours: the async engine and Redis client reach the database and server of the sync ones."""

from __future__ import annotations

import asyncio
import gc
import threading
import uuid
import warnings
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, func, insert, select, text
from sqlalchemy.engine import make_url

from reliable import Reliability
from reliable.aio_backends import async_url
from reliable.errors import ConfigurationError
from tests.waiting import wait_until

T = TypeVar("T")

notes_md = MetaData()
notes = Table(
    "aio_test_note",
    notes_md,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("text", String(32), nullable=False),
)


@pytest.mark.parametrize(
    ("sync", "expected"),
    [
        ("sqlite:///var/x.db", "sqlite+aiosqlite:///var/x.db"),
        ("sqlite+pysqlite:///x.db", "sqlite+aiosqlite:///x.db"),
        ("postgresql://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgresql+psycopg2://u:p@h:5/db", "postgresql+psycopg://u:p@h:5/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg://u@h/db"),
        ("mysql+pymysql://root@h:3306/db", "mysql+asyncmy://root@h:3306/db"),
        ("mariadb+pymysql://root@h/db", "mariadb+asyncmy://root@h/db"),
        ("mysql+aiomysql://root@h/db", "mysql+aiomysql://root@h/db"),
    ],
)
def test_the_async_url_is_the_same_database_through_an_asyncio_driver(sync: str, expected: str) -> None:
    assert async_url(sync).render_as_string(hide_password=False) == expected


def test_a_backend_without_an_asyncio_driver_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="no asyncio driver known for 'oracle'"):
        async_url("oracle+oracledb://u@h/db")


def test_async_session_commits_on_clean_exit_and_rolls_back_on_error(db_url: str) -> None:
    rel = Reliability(db_url)
    notes_md.create_all(rel.engine)
    with rel.engine.begin() as conn:
        conn.execute(notes.delete())

    async def scenario() -> None:
        async with rel.async_session() as s:
            await s.execute(insert(notes).values(text="kept"))
        with pytest.raises(RuntimeError):
            async with rel.async_session() as s:
                await s.execute(insert(notes).values(text="dropped"))
                raise RuntimeError("boom")
        await rel.aclose()

    try:
        asyncio.run(scenario())
        with rel.engine.connect() as conn:  # the sync engine sees what the async one wrote: one database
            assert conn.execute(select(notes.c.text)).scalars().all() == ["kept"]
    finally:
        rel.close()


def test_every_event_loop_gets_working_connections(sqlite_url: str) -> None:
    """asyncio.run twice on one Reliability: a pooled connection of the first loop is never reused."""
    rel = Reliability(sqlite_url)
    notes_md.create_all(rel.engine)

    async def count() -> int:
        async with rel.async_session() as s:
            return int((await s.execute(select(func.count()).select_from(notes))).scalar_one())

    try:
        first = asyncio.run(count())
        assert asyncio.run(count()) == first  # the first loop is closed; its engine was not reused
    finally:
        rel.close()


def test_async_redis_is_the_server_of_the_sync_client(
    sqlite_url: str, redis_url: str, key_prefix: str
) -> None:
    rel = Reliability(sqlite_url, redis_url)
    assert rel.redis is not None
    rel.redis.set(f"{key_prefix}:k", "from-sync", ex=60)

    async def read() -> bytes | str | None:
        client = rel.async_redis
        assert client is not None
        value = await client.get(f"{key_prefix}:k")
        await rel.aclose()
        return value

    try:
        assert asyncio.run(read()) == b"from-sync"
    finally:
        rel.close()


def test_without_redis_the_async_client_is_none(sqlite_url: str) -> None:
    rel = Reliability(sqlite_url, None)

    async def client() -> object:
        return rel.async_redis

    try:
        assert asyncio.run(client()) is None
    finally:
        rel.close()


def run_without_shutting_down(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a loop of its own and close the loop without ``shutdown_asyncgens`` (what code that
    manages its loop by hand may do; ``asyncio.run`` does shut them down)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def test_each_asyncio_run_closes_its_connections_when_its_loop_ends(
    postgres_url: str, redis_url: str
) -> None:
    """One ``asyncio.run`` per job and no ``aclose``: as each job's loop ends, its PostgreSQL connections and
    its Redis client are closed — not left open until the garbage collector finds them (before: one more
    server connection per job, and "unclosed Connection" warnings from redis)."""
    app = f"reliable-t-{uuid.uuid4().hex[:8]}"
    url = make_url(postgres_url).update_query_dict({"application_name": app})
    rel = Reliability(url.render_as_string(hide_password=False), redis_url=redis_url)
    probe = create_engine(postgres_url)

    def connections() -> int:
        with probe.connect() as conn:
            query = text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :app")
            return int(conn.execute(query, {"app": app}).scalar_one())

    async def job() -> None:
        async with rel.async_session() as s:
            await s.execute(text("SELECT 1"))
        client = rel.aio.redis()
        assert client is not None
        assert await client.ping()

    gc.collect()  # what earlier tests left behind is not this test's
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for n in range(3):
                asyncio.run(job())
                wait_until(lambda: connections() == 0, 10, f"job {n}'s server connections to close")
            gc.collect()
    finally:
        rel.close()
        probe.dispose()
    assert [str(w.message) for w in caught if "unclosed" in str(w.message)] == []


def test_a_closed_loops_sqlite_connections_are_closed_not_left_to_the_garbage_collector(
    sqlite_url: str,
) -> None:
    """A process that runs one loop after another and never calls ``aclose``, closing each loop without
    letting it shut down (so the loop's end did not close them): when the next loop starts, the previous
    loop's aiosqlite connections are closed, so nothing warns about an unclosed connection and no connection
    thread fails later on a loop that has gone."""
    rel = Reliability(sqlite_url)
    notes_md.create_all(rel.engine)
    failed: list[BaseException | None] = []
    hook = threading.excepthook
    threading.excepthook = lambda args: failed.append(args.exc_value)

    async def count() -> int:
        async with rel.async_session() as s:
            return int((await s.execute(select(func.count()).select_from(notes))).scalar_one())

    gc.collect()  # what earlier tests left behind is not this test's
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):  # each new loop lets go of the one before
                run_without_shutting_down(count())
                gc.collect()
    finally:
        threading.excepthook = hook
        rel.close()
    unclosed = [
        str(w.message) for w in caught if "deleted before being closed" in str(w.message)
    ]  # aiosqlite
    assert unclosed == [] and failed == []
