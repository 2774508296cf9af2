"""The Redis fast path: a lease per (group, message id), a ``done`` marker, and compare-and-delete.

Key ``{prefix}:{group}:{message_id}`` (see :mod:`reliable.constants`) holds

* ``processing:{owner}`` — set with ``SET NX PX lease``: one worker at a time runs the handler; if that worker
  dies the key expires after ``lease_ms`` and the broker's redelivery can take it;
* ``done:{hash16}`` — set after the database commit with a retention TTL, so a duplicate is answered without
  touching the database. ``hash16`` is the first 16 hex digits of the body's SHA-256: a *different* body under
  the same id does not match and falls through to the database, which raises the payload mismatch.

The acquire is one round trip: ``SET key value NX PX ms GET`` (Redis ≥ 7.0) sets the key if absent and returns
the previous value otherwise — nothing (taken by us), ``done…`` or ``processing:…`` (held) in one answer.
On a standalone or Sentinel client the commands are written straight onto a pooled connection
(:mod:`reliable.stores.resp`: a fraction of redis-py's per-command CPU); a Cluster client goes through
redis-py's pipeline, which routes each key to its node. Release is a Lua compare-and-delete so a worker
whose lease expired can never delete the lease a second worker has since taken.

The ``done`` marker is not waited for (issue 18): :meth:`RedisLeaseStore.mark_done_many` queues it, and it
goes out in the same pipeline as the next acquire of this store (no round trip of its own), or from a timer
thread at most ``DONE_MARKER_FLUSH_MS`` later when no acquire comes. Losing it (crash, Redis error) costs only
a database check: until it lands the key still holds our ``processing:`` lease, so a duplicate is answered by
the group's inbox row (``DUPLICATE_CONFIRMED``), or, once the lease expired, by the work transaction.

Redis is an optimisation, never the source of truth: any connection error, timeout or error reply makes the
answer :attr:`LeaseState.UNAVAILABLE`, the guard continues on the database alone, and the fallback is logged
and counted. After a failure the store does not call Redis again for ``retry_after_s`` so that a dead Redis
costs one timeout per interval rather than one per message. A lease write or release that failed may still
have reached Redis; it is compare-and-deleted on the next call once Redis answers
(:mod:`reliable.stores.orphans`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis as redis_lib

from reliable import constants as C
from reliable.redis_connect import REDIS_ERRORS, RedisClient
from reliable.stores import LeaseAnswer, LeaseState, call_at_exit, resp
from reliable.stores.breaker import FallbackHook
from reliable.stores.lease_plan import COMPARE_AND_DELETE as COMPARE_AND_DELETE  # re-exported: public
from reliable.stores.lease_plan import (
    LeaseBook,
    Mark,
    predates_set_get,
    previous_after_set_nx,
    queue_acquire,
    queue_marks,
    queue_pttl,
)
from reliable.stores.lease_plan import classify as classify

log = logging.getLogger("reliable.guard")

#: what sending queued markers may raise: Redis errors, and ValueError when the client was closed under the
#: timer thread at shutdown (its socket buffer is gone)
_MARK_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, ValueError)


def lease_key(prefix: str, group: str, message_id: str) -> str:
    return C.LEASE_KEY_FORMAT.format(prefix=prefix, group=group, message_id=message_id)


def processing_value(owner: str) -> str:
    return C.LEASE_PROCESSING_PREFIX + owner


def done_value(payload_hash: str | None) -> str:
    return C.LEASE_DONE_VALUE if not payload_hash else f"{C.LEASE_DONE_VALUE}:{payload_hash[:16]}"


def _mark_commands(marks: Sequence[Mark]) -> list[resp.Command]:
    """``SET key done… EX ttl`` per queued marker, for :mod:`reliable.stores.resp`."""
    return [("SET", key, value, "EX", str(ttl_s)) for key, value, ttl_s in marks]


class NoLeaseStore:
    """Database-only mode (``redis_url=None``): every message goes to the database check."""

    enabled = False

    def acquire_many(self, keys: Sequence[str], values: Sequence[str], lease_ms: int) -> list[LeaseAnswer]:
        return [LeaseAnswer(LeaseState.DISABLED)] * len(keys)

    def mark_done_many(self, items: Sequence[tuple[str, str]], ttl_s: int) -> None:
        return None

    def release(self, key: str, value: str) -> None:
        return None

    def remaining_ms(self, keys: Sequence[str]) -> list[int | None]:
        return [None] * len(keys)

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


class RedisLeaseStore:
    """Lease primitives over one Redis client (thread-safe: redis-py pools connections)."""

    enabled = True

    def __init__(
        self,
        client: RedisClient,
        *,
        retry_after_s: float = C.DEFAULT_REDIS_RETRY_AFTER_S,
        on_fallback: FallbackHook | None = None,
        clock: Callable[[], float] = time.monotonic,
        done_flush_ms: int = C.DONE_MARKER_FLUSH_MS,
    ) -> None:
        self.client = client
        self._book = LeaseBook(retry_after_s, on_fallback, clock)
        self.breaker = self._book.breaker
        self._cad = client.register_script(COMPARE_AND_DELETE)
        #: packed commands on the pool's connections (standalone, Sentinel); None: a cluster client
        self._raw = resp.for_client(client)
        self._set_get = True  # SET … NX GET needs Redis 7; flipped off once on an older server
        self._marks: list[Mark] = []  # done markers not yet sent
        self._marks_lock = threading.Lock()
        self._flush_s = done_flush_ms / 1000.0
        self._timer: threading.Thread | None = None
        self._closed = threading.Event()
        # the timer is a daemon thread, stopped without a word at exit: send what it still holds first
        call_at_exit(self.flush)

    # --- primitives ---------------------------------------------------------------------------------
    def acquire_many(self, keys: Sequence[str], values: Sequence[str], lease_ms: int) -> list[LeaseAnswer]:
        """``SET key processing:{owner} NX PX lease`` for each key, pipelined into one round trip."""
        skipped = self._book.acquire_skipped(len(keys), lease_ms)
        if skipped is not None:
            return skipped
        try:
            self._delete_orphans()
            previous = self._set_many(keys, values, lease_ms)
        except REDIS_ERRORS as exc:
            return self._book.acquire_failed(keys, values, lease_ms, exc)
        return self._book.acquired(previous, values)

    def _delete_orphans(self) -> None:
        """Compare-and-delete the leases of earlier failed calls (one pipeline; nothing to do as a rule)."""
        orphans = self._book.orphans.take()
        if not orphans:
            return
        try:
            # one call each, not a pipeline: a cluster pipeline takes no scripts (orphans are rare)
            for key, value, _ in orphans:
                self._cad(keys=[key], args=[value])
        except REDIS_ERRORS as exc:
            self._book.orphans_not_deleted(orphans, exc)
            return
        self._book.orphans_deleted(len(orphans))

    def _set_many(self, keys: Sequence[str], values: Sequence[str], lease_ms: int) -> list[Any]:
        marks = self._take_marks()
        if self._set_get:
            try:
                if self._raw is not None:
                    px = str(lease_ms)
                    commands = _mark_commands(marks)
                    commands += [
                        ("SET", k, v, "NX", "PX", px, "GET") for k, v in zip(keys, values, strict=True)
                    ]
                    return self._raw.execute(commands)[len(marks) :]
                if len(keys) == 1 and not marks:
                    return [self.client.set(keys[0], values[0], nx=True, px=lease_ms, get=True)]
                pipe = self.client.pipeline(transaction=False)
                queue_acquire(pipe, marks, keys, values, lease_ms)
                return list(pipe.execute())[len(marks) :]
            except redis_lib.ResponseError as exc:
                if not predates_set_get(exc):
                    raise
                log.info("redis server predates SET NX GET; using SET NX + GET")
                self._set_get = False
        # two round trips per key on Redis < 7: SET NX, then GET when the key was already there
        self._send_marks(marks)
        out: list[Any] = []
        for k, v in zip(keys, values, strict=True):
            taken = self.client.set(k, v, nx=True, px=lease_ms)
            out.append(previous_after_set_nx(taken, None if taken else self.client.get(k)))
        return out

    def mark_done_many(self, items: Sequence[tuple[str, str]], ttl_s: int) -> None:
        """Queue ``done`` markers to replace our leases after the commit; does not wait for Redis."""
        if not items or self.breaker.open():
            return
        with self._marks_lock:
            self._marks += [(key, value, ttl_s) for key, value in items]
            start = self._timer is None and not self._closed.is_set()
            if start:
                self._timer = threading.Thread(
                    target=self._flush_loop, name="reliable-done-markers", daemon=True
                )
        if start and self._timer is not None:
            self._timer.start()

    def flush(self) -> None:
        """Send the queued ``done`` markers now (one pipeline)."""
        self._send_marks(self._take_marks())

    def close(self) -> None:
        """Stop the timer thread and send what is queued (idempotent)."""
        self._closed.set()
        timer = self._timer
        if timer is not None and timer is not threading.current_thread():
            timer.join(timeout=5.0)
        self.flush()

    def _take_marks(self) -> list[Mark]:
        with self._marks_lock:
            marks, self._marks = self._marks, []
        return marks

    def _send_marks(self, marks: Sequence[Mark]) -> None:
        if not marks or self.breaker.open():
            return
        try:
            if self._raw is not None:
                self._raw.execute(_mark_commands(marks))
                return
            pipe = self.client.pipeline(transaction=False)
            queue_marks(pipe, marks)
            pipe.execute()
        except _MARK_ERRORS as exc:
            self.breaker.failed("mark_done", exc)

    def _flush_loop(self) -> None:
        """Timer: whatever no acquire took along is sent at most ``done_flush_ms`` after it was queued. The
        thread ends once a whole period passes with nothing queued (the next mark starts a new one)."""
        while not self._closed.wait(self._flush_s):
            marks = self._take_marks()
            if not marks:
                with self._marks_lock:
                    if not self._marks:
                        self._timer = None
                        return
                continue
            self._send_marks(marks)

    def remaining_ms(self, keys: Sequence[str]) -> list[int | None]:
        """``PTTL`` of each key, pipelined (Redis's answer: ``-2`` no key, ``-1`` no expiry); ``None`` each
        when Redis does not answer. Only asked for leases another worker holds (a lease conflict), never on
        the hot path: the adapter holds such a delivery until the lease can have run out."""
        if not keys or self.breaker.open():
            return [None] * len(keys)
        try:
            pipe = self.client.pipeline(transaction=False)
            queue_pttl(pipe, keys)
            replies = pipe.execute()
        except REDIS_ERRORS as exc:
            return self._book.pttl_failed(len(keys), exc)
        return [int(r) for r in replies]

    def release(self, key: str, value: str) -> None:
        """Compare-and-delete: free the key for a redelivery only if it still holds our own lease value."""
        if self._book.release_skipped(key, value):
            return
        try:
            self._delete_orphans()
            self._cad(keys=[key], args=[value])
        except REDIS_ERRORS as exc:
            self._book.release_failed(key, value, exc)
