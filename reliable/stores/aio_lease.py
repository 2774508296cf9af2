"""The Redis fast path on ``redis.asyncio``: the same keys, values, Lua script and answers as the sync store.

Only the I/O differs from :class:`reliable.stores.lease.RedisLeaseStore`: key names (:func:`lease_key`),
value formats (:func:`processing_value`, :func:`done_value`), how a previous value is read (:func:`classify`)
and the compare-and-delete script are imported from there, so a sync and an async worker of one group share
leases and done markers on one Redis. Redis stays an optimisation: any error makes the answer
``UNAVAILABLE`` and the guard continues on the database alone, with the same circuit breaker (one timeout per
``retry_after_s`` while Redis is down, not one per message), and the same clean-up of leases a failed call
may have set anyway (:mod:`reliable.stores.orphans`).
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
from reliable.stores import LeaseAnswer, LeaseState
from reliable.stores.breaker import FallbackHook, RedisBreaker
from reliable.stores.lease import COMPARE_AND_DELETE, classify
from reliable.stores.orphans import Orphans

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger(C.GUARD_LOGGER)

#: what a pre-7.0 server's ``SET … NX GET`` error says; the store then uses SET NX + GET.
_NO_SET_GET = "syntax"
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
        self.breaker = RedisBreaker(retry_after_s, on_fallback, clock)
        self._orphans = Orphans(retry_after_s, clock)  # leases of failed calls that may have landed anyway
        self._lease_ms = C.DEFAULT_LEASE_MS  # the last acquire's: how long a lease to free may still live
        self._cad = client.register_script(COMPARE_AND_DELETE)
        self._set_get = True
        self._marks: list[tuple[str, str, int]] = []  # done markers not yet sent (this loop's tasks only)
        self._flush_s = done_flush_ms / 1000.0
        self._flusher: asyncio.Task[None] | None = None  # sends queued markers no acquire took along

    # --- primitives -------------------------------------------------------------------------------------
    async def acquire_many(
        self, keys: Sequence[str], values: Sequence[str], lease_ms: int
    ) -> list[LeaseAnswer]:
        """``SET key processing:{owner} NX PX lease GET`` per key, pipelined into one round trip."""
        if self.breaker.open():
            self.breaker.skipped("acquire")
            return [LeaseAnswer(LeaseState.UNAVAILABLE)] * len(keys)
        self._lease_ms = lease_ms
        try:
            await self._delete_orphans()
            previous = await self._set_many(keys, values, lease_ms)
        except _CLIENT_ERRORS as exc:
            self._orphans.keep(zip(keys, values, strict=True), lease_ms)
            self.breaker.failed("acquire", exc)
            return [LeaseAnswer(LeaseState.UNAVAILABLE)] * len(keys)
        self.breaker.succeeded()
        # our own value back is our lease: a retried write whose first attempt had reached the server
        return [classify(p, v) for p, v in zip(previous, values, strict=True)]

    async def _delete_orphans(self) -> None:
        """Compare-and-delete the leases of earlier failed calls (one pipeline; nothing to do as a rule)."""
        orphans = self._orphans.take()
        if not orphans:
            return
        try:
            # one call each, not a pipeline: a cluster pipeline takes no scripts (orphans are rare)
            for key, value, _ in orphans:
                await self._cad(keys=[key], args=[value])
        except _CLIENT_ERRORS as exc:  # not this call's failure: its own commands still go out
            self._orphans.give_back(orphans)
            # debug: the call carrying them goes to the same Redis and reports an outage itself
            log.debug("redis: %d stray lease(s) not deleted yet, trying again later: %r", len(orphans), exc)
            return
        log.debug("compare-and-deleted %d lease(s) of failed redis calls", len(orphans))

    async def _set_many(self, keys: Sequence[str], values: Sequence[str], lease_ms: int) -> list[Any]:
        marks, self._marks = self._marks, []
        if self._set_get:
            try:
                if len(keys) == 1 and not marks:
                    return [await self.client.set(keys[0], values[0], nx=True, px=lease_ms, get=True)]
                pipe = self.client.pipeline(transaction=False)
                for key, value, ttl_s in marks:  # queued done markers ride along, ahead of our keys
                    pipe.set(key, value, ex=ttl_s)
                for k, v in zip(keys, values, strict=True):
                    pipe.set(k, v, nx=True, px=lease_ms, get=True)
                return list(await pipe.execute())[len(marks) :]
            except redis_lib.ResponseError as exc:
                if _NO_SET_GET not in str(exc).lower():
                    raise
                log.info("redis server predates SET NX GET; using SET NX + GET")
                self._set_get = False
        await self._send_marks(marks)
        out: list[Any] = []
        for k, v in zip(keys, values, strict=True):
            if await self.client.set(k, v, nx=True, px=lease_ms):
                out.append(None)
            else:
                current = await self.client.get(k)
                out.append(current if current is not None else b"processing:?")
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

    async def _send_marks(self, marks: Sequence[tuple[str, str, int]]) -> None:
        if not marks or self.breaker.open():
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for key, value, ttl_s in marks:
                pipe.set(key, value, ex=ttl_s)
            await pipe.execute()
        except _CLIENT_ERRORS as exc:
            self.breaker.failed("mark_done", exc)

    async def remaining_ms(self, keys: Sequence[str]) -> list[int | None]:
        """``PTTL`` of each key (as :meth:`RedisLeaseStore.remaining_ms`: lease conflicts only)."""
        if not keys or self.breaker.open():
            return [None] * len(keys)
        try:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.pttl(key)
            replies = await pipe.execute()
        except _CLIENT_ERRORS as exc:
            self.breaker.failed("pttl", exc)
            return [None] * len(keys)
        return [int(r) for r in replies]

    async def release(self, key: str, value: str) -> None:
        """Compare-and-delete: free the key only if it still holds our own lease value."""
        if self.breaker.open():
            self._orphans.keep([(key, value)], self._lease_ms)
            return
        try:
            await self._delete_orphans()
            await self._cad(keys=[key], args=[value])
        except _CLIENT_ERRORS as exc:
            self._orphans.keep([(key, value)], self._lease_ms)
            self.breaker.failed("release", exc)


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
