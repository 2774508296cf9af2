"""What the sync and the asyncio Redis lease stores decide, without their I/O.

Why a module of its own: :class:`reliable.stores.lease.RedisLeaseStore` (redis-py, shared by threads) and
:class:`reliable.stores.aio_lease.AsyncRedisLeaseStore` (``redis.asyncio``, one event loop) must give the same
answers for the same Redis replies — a sync and an async worker of one group share leases and done markers on
one Redis — and must leave the same things behind after a failure: the circuit breaker opened, the leases of
the failed call kept for a later compare-and-delete (:mod:`reliable.stores.orphans`). Those decisions, the
compare-and-delete script, how a previous value is read, and which commands go into a pipeline are here,
once. What is left in each store is what really differs: awaiting Redis or not, which errors count as Redis
being away (the asyncio cluster client raises more than Redis errors), and how done markers wait to be sent
(a lock and a timer thread, or a task on the loop).

Nothing here talks to Redis: the pipelines are only filled (both clients queue a command without I/O).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from reliable import constants as C
from reliable.stores import LeaseAnswer, LeaseState
from reliable.stores.breaker import FallbackHook, RedisBreaker
from reliable.stores.orphans import Orphans

log = logging.getLogger(C.GUARD_LOGGER)

#: KEYS[1] = lease key, ARGV[1] = the exact value we set; deletes only if it is still ours.
COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

#: a queued done marker: (key, value, ttl_s)
Mark = tuple[str, str, int]

#: what a pre-7.0 server's ``SET … NX GET`` error says; the store then uses SET NX + GET
_NO_SET_GET = "syntax"
#: the previous value when ``SET NX`` found the key but the ``GET`` after it did not (it expired between):
#: someone else's lease, as far as this acquire knows
_HELD_BY_UNKNOWN = b"processing:?"

_DONE = C.LEASE_DONE_VALUE.encode()
_DONE_PREFIX = _DONE + b":"


def classify(previous: bytes | str | None, ours: str | None = None) -> LeaseAnswer:
    """Interpret the value ``SET NX GET`` returned: ``None`` means we took the key — and so does our own
    value ``ours`` (a retried write whose first attempt had reached the server)."""
    if previous is None:
        return LeaseAnswer(LeaseState.ACQUIRED)
    raw = previous.encode() if isinstance(previous, str) else previous
    if ours is not None and raw == ours.encode():
        return LeaseAnswer(LeaseState.ACQUIRED)
    if raw == _DONE:
        return LeaseAnswer(LeaseState.DONE)
    if raw.startswith(_DONE_PREFIX):
        return LeaseAnswer(LeaseState.DONE, raw[len(_DONE_PREFIX) :].decode("ascii", "replace"))
    return LeaseAnswer(LeaseState.HELD)


def predates_set_get(exc: BaseException) -> bool:
    """Whether a ``ResponseError`` to ``SET … NX GET`` says the server is older than Redis 7.0."""
    return _NO_SET_GET in str(exc).lower()


def previous_after_set_nx(taken: object, current: Any) -> Any:
    """What ``SET NX GET`` would have returned, from ``SET NX`` (``taken``) and the ``GET`` after it."""
    if taken:
        return None
    return current if current is not None else _HELD_BY_UNKNOWN


class Pipeline(Protocol):
    """The part of a redis-py pipeline (sync or asyncio) filled here; queuing a command does no I/O."""

    def set(
        self,
        name: str,
        value: str,
        *,
        ex: int | None = ...,
        px: int | None = ...,
        nx: bool = ...,
        get: bool = ...,
    ) -> object: ...

    def pttl(self, name: str) -> object: ...


def queue_marks(pipe: Pipeline, marks: Sequence[Mark]) -> None:
    """``SET key done… EX ttl`` per queued marker."""
    for key, value, ttl_s in marks:
        pipe.set(key, value, ex=ttl_s)


def queue_acquire(
    pipe: Pipeline, marks: Sequence[Mark], keys: Sequence[str], values: Sequence[str], lease_ms: int
) -> None:
    """Queued done markers ride along, ahead of our ``SET key value NX PX lease GET`` per key (the replies
    past ``len(marks)`` are the previous values)."""
    queue_marks(pipe, marks)
    for k, v in zip(keys, values, strict=True):
        pipe.set(k, v, nx=True, px=lease_ms, get=True)


def queue_pttl(pipe: Pipeline, keys: Sequence[str]) -> None:
    for key in keys:
        pipe.pttl(key)


class LeaseBook:
    """A store's circuit breaker, the leases its failed calls may have set, and the last acquire's lease
    length (how long such a lease can still live); each method is one outcome of one store call."""

    def __init__(
        self,
        retry_after_s: float,
        on_fallback: FallbackHook | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.breaker = RedisBreaker(retry_after_s, on_fallback, clock)
        self.orphans = Orphans(retry_after_s, clock)  # leases of failed calls that may have landed anyway
        self.lease_ms = C.DEFAULT_LEASE_MS

    def acquire_skipped(self, count: int, lease_ms: int) -> list[LeaseAnswer] | None:
        """The answers of an acquire that does not ask Redis (breaker open); ``None``: ask it."""
        if self.breaker.open():
            self.breaker.skipped("acquire")
            return unavailable(count)
        self.lease_ms = lease_ms
        return None

    def acquire_failed(
        self, keys: Sequence[str], values: Sequence[str], lease_ms: int, exc: BaseException
    ) -> list[LeaseAnswer]:
        """The acquire's writes may have landed: keep them to delete later; the guard goes on the database."""
        self.orphans.keep(zip(keys, values, strict=True), lease_ms)
        self.breaker.failed("acquire", exc)
        return unavailable(len(keys))

    def acquired(self, previous: Iterable[Any], values: Sequence[str]) -> list[LeaseAnswer]:
        """Redis answered: one answer per key from the previous values (our own value back is our lease)."""
        self.breaker.succeeded()
        return [classify(p, v) for p, v in zip(previous, values, strict=True)]

    def release_skipped(self, key: str, value: str) -> bool:
        """Whether a release does not ask Redis (breaker open): the lease is then kept to delete later."""
        if not self.breaker.open():
            return False
        self.orphans.keep([(key, value)], self.lease_ms)
        return True

    def release_failed(self, key: str, value: str, exc: BaseException) -> None:
        self.orphans.keep([(key, value)], self.lease_ms)
        self.breaker.failed("release", exc)

    def orphans_not_deleted(self, orphans: Iterable[tuple[str, str, float]], exc: BaseException) -> None:
        """Not the carrying call's failure (its own commands still go out): tried again later."""
        orphans = list(orphans)
        self.orphans.give_back(orphans)
        # debug: the call carrying them goes to the same Redis and reports an outage itself
        log.debug("redis: %d stray lease(s) not deleted yet, trying again later: %r", len(orphans), exc)

    def orphans_deleted(self, count: int) -> None:
        log.debug("compare-and-deleted %d lease(s) of failed redis calls", count)

    def pttl_failed(self, count: int, exc: BaseException) -> list[int | None]:
        self.breaker.failed("pttl", exc)
        return [None] * count


def unavailable(count: int) -> list[LeaseAnswer]:
    return [LeaseAnswer(LeaseState.UNAVAILABLE)] * count
