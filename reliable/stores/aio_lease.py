"""The Redis fast path on ``redis.asyncio``: the same keys, values, Lua script and answers as the sync store.

Only the I/O differs from :class:`reliable.stores.lease.RedisLeaseStore`: how a previous value is read
(:func:`~reliable.stores.lease_plan.classify`), the compare-and-delete script, the pipelined commands and
what each outcome of a call leaves behind (:class:`~reliable.stores.lease_plan.LeaseBook`) are the ones of
:mod:`reliable.stores.lease_plan`, as are the keys and values the guard passes in, so a sync and an async
worker of one group share leases and done markers on one Redis. Redis stays an optimisation: any error makes
the answer ``UNAVAILABLE`` and the guard continues on the database alone, with the same circuit breaker (one
timeout per ``retry_after_s`` while Redis is down, not one per message), and the same clean-up of leases a
failed call may have set anyway (:mod:`reliable.stores.orphans`). What stays here and differs on purpose:
every Redis call is awaited, any ``Exception`` of the client counts as Redis being away (below), and queued
done markers are sent by a task on the loop (no lock: one loop's tasks only) instead of a timer thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis as redis_lib
from sqlalchemy.util import await_only

from reliable import constants as C
from reliable.stores import LeaseAnswer
from reliable.stores import lease_plan as plan
from reliable.stores.breaker import FallbackHook

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger(C.GUARD_LOGGER)

#: what the client may raise that is the server's absence, not a bug: redis.asyncio's cluster client raises
#: ``AttributeError`` ("'NoneType' object has no attribute 'writelines'") on a connection another task tore
#: down when a node died, which escaped the guard instead of leaving it on the database. Every
#: ``Exception`` opens the breaker (never ``CancelledError``: that is not one); the breaker logs one that is
#: not a Redis or socket error with its traceback.
_CLIENT_ERRORS = (Exception,)


class AsyncRedisLeaseStore:
    """Lease primitives over one ``redis.asyncio`` client (safe for many tasks on one loop)."""

    enabled = True

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        retry_after_s: float = C.DEFAULT_REDIS_RETRY_AFTER_S,
        on_fallback: FallbackHook | None = None,
        clock: Callable[[], float] = time.monotonic,
        done_flush_ms: int = C.DONE_MARKER_FLUSH_MS,
    ) -> None:
        self.client = client
        self._book = plan.LeaseBook(retry_after_s, on_fallback, clock)
        self.breaker = self._book.breaker
        self._cad = client.register_script(plan.COMPARE_AND_DELETE)
        self._set_get = True
        self._marks: list[plan.Mark] = []  # done markers not yet sent (this loop's tasks only)
        self._flush_s = done_flush_ms / 1000.0
        self._flusher: asyncio.Task[None] | None = None  # sends queued markers no acquire took along

    # --- primitives -------------------------------------------------------------------------------------
    async def acquire_many(
        self, keys: Sequence[str], values: Sequence[str], lease_ms: int
    ) -> list[LeaseAnswer]:
        """``SET key processing:{owner} NX PX lease GET`` per key, pipelined into one round trip."""
        skipped = self._book.acquire_skipped(len(keys), lease_ms)
        if skipped is not None:
            return skipped
        try:
            await self._delete_orphans()
            previous = await self._set_many(keys, values, lease_ms)
        except _CLIENT_ERRORS as exc:
            return self._book.acquire_failed(keys, values, lease_ms, exc)
        return self._book.acquired(previous, values)

    async def _delete_orphans(self) -> None:
        """Compare-and-delete the leases of earlier failed calls (one pipeline; nothing to do as a rule)."""
        orphans = self._book.orphans.take()
        if not orphans:
            return
        try:
            # one call each, not a pipeline: a cluster pipeline takes no scripts (orphans are rare)
            for key, value, _ in orphans:
                await self._cad(keys=[key], args=[value])
        except _CLIENT_ERRORS as exc:
            self._book.orphans_not_deleted(orphans, exc)
            return
        self._book.orphans_deleted(len(orphans))

    async def _set_many(self, keys: Sequence[str], values: Sequence[str], lease_ms: int) -> list[Any]:
        marks, self._marks = self._marks, []
        if self._set_get:
            try:
                if len(keys) == 1 and not marks:
                    return [await self.client.set(keys[0], values[0], nx=True, px=lease_ms, get=True)]
                pipe = self.client.pipeline(transaction=False)
                plan.queue_acquire(pipe, marks, keys, values, lease_ms)
                return list(await pipe.execute())[len(marks) :]
            except redis_lib.ResponseError as exc:
                if not plan.predates_set_get(exc):
                    raise
                log.info("redis server predates SET NX GET; using SET NX + GET")
                self._set_get = False
        await self._send_marks(marks)
        out: list[Any] = []
        for k, v in zip(keys, values, strict=True):
            taken = await self.client.set(k, v, nx=True, px=lease_ms)
            out.append(plan.previous_after_set_nx(taken, None if taken else await self.client.get(k)))
        return out

    def queue_done(self, items: Sequence[tuple[str, str]], ttl_s: int) -> None:
        """Queue ``done`` markers (not waited for, as in the sync store): they ride in the next acquire's
        pipeline, or a flush scheduled on the running loop sends them ``DONE_MARKER_FLUSH_MS`` later."""
        if not items or self.breaker.open():
            return
        self._marks += [(key, value, ttl_s) for key, value in items]
        if self._flusher is None:
            # The flush task is created here, while a task of the loop runs, and sleeps — not later from a
            # bare loop timer, which can fire in the loop's last iteration at shutdown and leave a task that
            # never starts ("coroutine … was never awaited"). A sleeping task is one asyncio.run cancels.
            self._flusher = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        """Send what no acquire took along, ``done_flush_ms`` after it was queued, until nothing is left."""
        try:
            while self._marks:
                await asyncio.sleep(self._flush_s)
                await self.flush()
        finally:
            self._flusher = None  # no await after the last check: a later queue_done starts a new task

    async def flush(self) -> None:
        """Send the queued ``done`` markers now (one pipeline)."""
        marks, self._marks = self._marks, []
        await self._send_marks(marks)

    async def aclose(self) -> None:
        """Send the queued markers and let the flush task end (with nothing left, it ends after its current
        sleep), on this loop while its Redis client is still open: left queued, a marker keeps the lease of
        a committed delivery in Redis, and the next delivery of that message — the usual duplicate after a
        restart — costs a database check instead of one Redis round trip."""
        await self.flush()
        if self._flusher is not None:  # at asyncio.run's end it was cancelled already: gather takes that too
            await asyncio.gather(self._flusher, return_exceptions=True)

    async def mark_done_many(self, items: Sequence[tuple[str, str]], ttl_s: int) -> None:
        """Write ``done`` markers now and wait for Redis (what :meth:`flush` does for queued ones)."""
        await self._send_marks([(key, value, ttl_s) for key, value in items])

    async def _send_marks(self, marks: Sequence[plan.Mark]) -> None:
        if not marks or self.breaker.open():
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            plan.queue_marks(pipe, marks)
            await pipe.execute()
        except _CLIENT_ERRORS as exc:
            self.breaker.failed("mark_done", exc)

    async def remaining_ms(self, keys: Sequence[str]) -> list[int | None]:
        """``PTTL`` of each key (as :meth:`RedisLeaseStore.remaining_ms`: lease conflicts only)."""
        if not keys or self.breaker.open():
            return [None] * len(keys)
        try:
            pipe = self.client.pipeline(transaction=False)
            plan.queue_pttl(pipe, keys)
            replies = await pipe.execute()
        except _CLIENT_ERRORS as exc:
            return self._book.pttl_failed(len(keys), exc)
        return [int(r) for r in replies]

    async def release(self, key: str, value: str) -> None:
        """Compare-and-delete: free the key only if it still holds our own lease value."""
        if self._book.release_skipped(key, value):
            return
        try:
            await self._delete_orphans()
            await self._cad(keys=[key], args=[value])
        except _CLIENT_ERRORS as exc:
            self._book.release_failed(key, value, exc)


class GreenletLeaseStore:
    """The synchronous lease interface over :class:`AsyncRedisLeaseStore`, for code run by ``greenlet_spawn``.

    The asyncio guard runs the one guard algorithm (:class:`reliable.guard.core.Guard`) inside SQLAlchemy's
    greenlet bridge; each call here suspends that greenlet while the event loop awaits Redis, so the loop is
    never blocked. Only valid inside ``greenlet_spawn`` (as every ``AsyncEngine`` call is).
    """

    enabled = True

    def __init__(self, store: AsyncRedisLeaseStore) -> None:
        self.store = store

    def acquire_many(self, keys: Sequence[str], values: Sequence[str], lease_ms: int) -> list[LeaseAnswer]:
        return await_only(self.store.acquire_many(keys, values, lease_ms))

    def mark_done_many(self, items: Sequence[tuple[str, str]], ttl_s: int) -> None:
        self.store.queue_done(items, ttl_s)  # not waited for (see there)

    def release(self, key: str, value: str) -> None:
        await_only(self.store.release(key, value))

    def remaining_ms(self, keys: Sequence[str]) -> list[int | None]:
        return await_only(self.store.remaining_ms(keys))

    def flush(self) -> None:
        await_only(self.store.flush())

    def close(self) -> None:
        """Nothing to do from a thread: queued markers are sent by their event loop (or lost: a DB check)."""
