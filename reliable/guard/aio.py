"""The guard for ``async def`` handlers: the *same* orchestrator, its I/O edges awaited on the event loop.

Why no second orchestrator: DESIGN.md §2 is one algorithm, and every way out of it (the fast path, the
journal, the happy case first, the optimistic batch, the conditional confirm, the attempt count, the lease
outcome) lives in :class:`reliable.guard.core.Guard` and :class:`reliable.guard.work.WorkTransaction`. A
copy with ``await`` in front of each call would drift. Instead this module runs that very ``Guard`` inside
SQLAlchemy's greenlet bridge (``greenlet_spawn`` — how ``AsyncSession`` itself works) and swaps its three
I/O edges for asyncio ones:

==================  =========================================================================================
edge                asyncio flavour
==================  =========================================================================================
database            the running loop's ``AsyncEngine.sync_engine``: every statement of :class:`SqlStore`
                    goes through the asyncio driver (psycopg async, aiosqlite, asyncmy) and suspends the
                    greenlet, not the thread, while the loop waits
Redis               :class:`~reliable.stores.aio_lease.GreenletLeaseStore` over ``redis.asyncio`` (same keys,
                    values and Lua script as the sync store)
handler             ``await handler(env, session)`` with an ``AsyncSession`` on the guard's own connection, in
                    the guard's transaction (so its writes commit with the confirmation, exactly once)
==================  =========================================================================================

So many tasks on one loop interleave at every database and Redis round trip, and a sync and an async worker
of one group share rows, leases and done markers.

Cancellation: a task cancelled *inside the handler* becomes a handler failure (:class:`HandlerCancelled`), so
the guard rolls the transaction back, counts the attempt and releases the lease (the message is
retryable at once); then ``CancelledError`` is raised again to the caller, as asyncio requires — also when
the cancel lands in the handler's own statement (SQLAlchemy invalidates the connection), and when another
error comes out of the handler while its task's cancel count has risen (still its cancel, not an outage). A
``CancelledError`` out of the handler while its task is not being cancelled is an ordinary failure
(:class:`StrayCancel`): answered like any other, never raised to the caller. A task
cancelled while the guard itself awaits the database or Redis unwinds with the transaction rolled back; its
Redis lease, if it took one, lapses after ``lease_ms``. Where the driver turns the cancel into an error of
its own (asyncmy), the guard answers that delivery as an outage and :meth:`AsyncGuard.process` still raises
``CancelledError`` (it sees the task's pending cancel request).

Limits: ``journal_write_behind`` is a background *thread* of the sync guard: refused here when set to
``True``; the default (``None``) journals every delivery synchronously in this guard.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from sqlalchemy import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.util import await_only, greenlet_spawn

from reliable import constants as C
from reliable.aio_backends import PerLoop
from reliable.errors import ConfigurationError
from reliable.guard.core import Guard
from reliable.guard.decision import Decision, GuardHooks, HandlerCancelled, StrayCancel
from reliable.names import check_group
from reliable.settings import Settings
from reliable.stores.aio_lease import AsyncRedisLeaseStore, GreenletLeaseStore
from reliable.types import ConsumeResult, Envelope

if TYPE_CHECKING:
    from reliable.facade import Reliability

AsyncHandler = Callable[[Envelope, AsyncSession], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class _LoopStores:
    """What :class:`Guard` reads from a ``Reliability``, for one event loop (Redis is set on the guard)."""

    settings: Settings
    engine: Engine
    redis: None = None


class AsyncGuard:
    """Guards ``async def handler(env, session)`` for ``group``: ``await guard.process(envs)``."""

    def __init__(
        self,
        rel: Reliability,
        group: str,
        handler: AsyncHandler,
        *,
        registry: CollectorRegistry | None = None,
        hooks: Sequence[GuardHooks] = (),
        redis_retry_after_s: float = C.DEFAULT_REDIS_RETRY_AFTER_S,
        durable_journal: bool = False,
    ) -> None:
        if rel.settings.journal_write_behind is True:  # the default None means "not here"
            raise ConfigurationError("journal_write_behind is not available for async def handlers")
        check_group(group)
        self.rel = rel
        self.group = group
        self.handler = handler
        self._options: dict[str, Any] = {
            "registry": registry,
            "hooks": hooks,
            "durable_journal": durable_journal,
        }
        self._retry_after_s = redis_retry_after_s
        self._guards = PerLoop(self._loop_guard)

    async def __call__(self, env: Envelope) -> Decision:
        return (await self.process([env]))[0]

    async def process(self, envs: Sequence[Envelope]) -> list[Decision]:
        """Run the guard for ``envs`` (one journal and one work transaction) and decide each."""
        guard = self._guards.get()
        task = asyncio.current_task()
        cancels = task.cancelling() if task is not None else 0
        decisions: list[Decision] = await greenlet_spawn(guard.process, list(envs))
        if any(isinstance(d.error, HandlerCancelled) for d in decisions):
            raise asyncio.CancelledError("handler cancelled; rolled back, the message stays retryable")
        if task is not None and task.cancelling() > cancels:
            # cancelled while the guard awaited the database: a driver may turn that into an error of its own
            # (asyncmy closes the connection: "Cancelled during execution"), which the guard answered as an
            # outage — nothing committed, the message stays retryable; the cancel itself must still reach
            # the caller, or a cancelled worker goes on to its next message
            raise asyncio.CancelledError("cancelled while the guard waited on the database; rolled back")
        return decisions

    # --- one Guard per event loop (asyncio connections belong to their loop) -------------------------
    def _loop_guard(self) -> Guard:
        engine = self.rel.aio.engine()
        # no write-behind here: its flush thread cannot do asyncio I/O (every row is journaled in-line)
        stores = _LoopStores(self.rel.settings.replace(journal_write_behind=False), engine.sync_engine)
        guard = Guard(stores, self.group, self._bridge(engine), **self._options)
        client = self.rel.aio.redis()
        store = None
        if client is not None:
            store = AsyncRedisLeaseStore(
                client, retry_after_s=self._retry_after_s, on_fallback=guard._redis_fallback
            )
            guard.lease = GreenletLeaseStore(store)  # type: ignore[assignment]
        self.rel.aio.before_close(functools.partial(self._let_go, guard, store))
        return guard

    async def _let_go(self, guard: Guard, store: AsyncRedisLeaseStore | None) -> None:
        """Before this loop's engine and Redis client close (``rel.aclose()``, or the loop's end): forget
        the loop's guard, so a later call on the loop builds one on the new connections, and send the done
        markers it still has queued (:meth:`AsyncRedisLeaseStore.aclose`)."""
        if self._guards.current() is guard:
            self._guards.pop_current()
        if store is not None:
            await store.aclose()

    def _bridge(self, engine: AsyncEngine) -> Callable[[Envelope, Session], None]:
        """The sync handler the guard calls: awaits ``handler`` with an AsyncSession on the guard's conn."""
        handler = self.handler

        async def call(env: Envelope, session: AsyncSession) -> None:
            try:
                await handler(env, session)
                await session.flush()
            finally:
                await session.close()

        def run(env: Envelope, session: Session) -> None:
            # this delivery's connection, in the guard's transaction (read before anything awaits)
            conn = session.bind
            if not isinstance(conn, Connection):
                raise TypeError(f"guard session is bound to {type(conn).__name__}, not a Connection")
            async_session = AsyncSession(
                bind=AsyncConnection(engine, conn),
                join_transaction_mode="rollback_only",
                expire_on_commit=False,
            )
            # what the handler stages through it is sent once the guard has committed (reliable.producer)
            async_session.sync_session.info[C.SESSION_AFTER_COMMIT] = session.info[C.SESSION_AFTER_COMMIT]
            task = asyncio.current_task()
            cancels = task.cancelling() if task is not None else 0
            try:
                await_only(call(env, async_session))
            except BaseException as exc:
                failure = _cancel_failure(env, exc, task, cancels)
                if failure is None:
                    raise
                raise failure from exc

        return run


def _cancel_failure(
    env: Envelope, exc: BaseException, task: asyncio.Task[Any] | None, cancels: int
) -> Exception | None:
    """What a handler's exception is to the guard when a cancel is involved (``None``: itself)."""
    cancelled = task is not None and task.cancelling() > 0
    if isinstance(exc, asyncio.CancelledError):
        if cancelled:
            return HandlerCancelled(f"handler of {env.message_id!r} was cancelled")
        return StrayCancel(f"handler of {env.message_id!r} raised {exc!r}; its task was not cancelled")
    if isinstance(exc, Exception) and task is not None and task.cancelling() > cancels:
        # the task was cancelled under the handler, and what came out is another error: a statement tidying
        # up on the connection the cancel invalidated (SQLAlchemy's PendingRollbackError; asyncmy's next
        # command: InterfaceError "Cancelled during execution"), a library wrapping the cancel — still the
        # handler's cancel, counted as its failure, not a database outage
        return HandlerCancelled(f"handler of {env.message_id!r} was cancelled: {exc!r}")
    return None


class AsyncGuardedHandler:
    """An ``async def`` handler wrapped by the guard: ``await handle(env)`` gives a :class:`ConsumeResult`."""

    __name__: str  # the handler's, copied by functools.update_wrapper (as are __doc__ and __module__)

    def __init__(self, guard: AsyncGuard) -> None:
        self.guard = guard
        functools.update_wrapper(self, guard.handler)

    @property
    def group(self) -> str:
        return self.guard.group

    async def __call__(self, env: Envelope) -> ConsumeResult:
        return (await self.guard(env)).result

    async def decide(self, env: Envelope) -> Decision:
        """The full decision for one delivery (outcome, reason, duplicate flag, journal row id)."""
        return await self.guard(env)

    async def batch(self, envs: Sequence[Envelope]) -> list[ConsumeResult]:
        """Guard a list of deliveries with one lease pipeline, one journal and one work transaction."""
        return [d.result for d in await self.guard.process(envs)]

    async def decide_batch(self, envs: Sequence[Envelope]) -> list[Decision]:
        return await self.guard.process(envs)

    async def flush_markers(self) -> None:
        """Send this loop's queued Redis ``done`` markers now (they are queued after each commit)."""
        guard = self.guard._guards.get()
        await greenlet_spawn(guard.lease.flush)

    def close(self) -> None:
        """Nothing to flush (no write-behind journal here); for symmetry with the sync handler."""
