"""Leases we may have set without knowing it, kept until Redis answers again and then compare-and-deleted.

Why: a lease ``SET`` (or a release) whose reply never came may still have reached Redis — the server was
slow, not gone (``DEBUG SLEEP``, a fork for a snapshot, a paused client). The guard then decided on the
database alone and does not own that lease, so nothing released it, and when the handler failed every
redelivery of the message met our stray ``processing:`` value (LEASE_CONFLICT) until ``lease_ms`` ran out.
So the stores keep each (key, value) of a failed call and delete it, with the compare-and-delete script, on
their next call once Redis answers. That is always safe: the script deletes only our own per-delivery value
— a ``done`` marker or another worker's lease stays. An entry is dropped once its lease would have expired
anyway, which also bounds the list during a long outage. A delete that fails (a Cluster node still down
for a key's slot) does not fail the call that carried it, and is tried again ``retry_after_s`` later.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

#: (key, value) — a lease value we tried to set or free
Pair = tuple[str, str]


class Orphans:
    """Thread-safe list of (key, value, expires_at) (the sync store is shared by threads)."""

    def __init__(self, retry_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._retry_after_s = retry_after_s
        self._not_before = 0.0  # after a failed delete: not before this time again
        self._items: list[tuple[str, str, float]] = []
        self._lock = threading.Lock()

    def keep(self, pairs: Iterable[Pair], lease_ms: int) -> None:
        """Remember ``pairs`` for at most ``lease_ms`` (after that Redis has expired them itself)."""
        until = self._clock() + lease_ms / 1000.0
        with self._lock:
            self._items += [(k, v, until) for k, v in pairs]

    def take(self) -> list[tuple[str, str, float]]:
        """The entries still worth deleting; the list is empty afterwards (see :meth:`give_back`). None
        within ``retry_after_s`` of a failed delete."""
        now = self._clock()
        if now < self._not_before:
            return []
        with self._lock:
            items, self._items = self._items, []
        return [item for item in items if item[2] > now]

    def give_back(self, items: Iterable[tuple[str, str, float]]) -> None:
        """Entries whose delete failed: tried again on a call ``retry_after_s`` from now."""
        self._not_before = self._clock() + self._retry_after_s
        with self._lock:
            self._items = [*items, *self._items]
