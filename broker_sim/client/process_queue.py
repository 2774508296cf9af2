"""The consumer's in-flight window for one message queue.

Pulled messages wait here, keyed by queue offset, until the listener has finished them. The offset a consumer
may commit is the *smallest unfinished* offset (or ``last pulled + 1`` when nothing is in flight): committing
anything larger could skip a message still being processed if the consumer died. This is exactly why one
stalled message holds a queue's committed offset back while later ones finish (seed 000 §2.3), and why a crash
then redelivers everything after it.

"Last pulled", not "largest ever pulled" (RocketMQ's ``ProcessQueue.queueOffsetMax`` is assigned, not
maximised): when the broker moves a queue's offset back — a master that came back behind its slave answers
``PULL_OFFSET_MOVED`` — the window follows the new position. A largest-ever value would make the first
commit after the move jump past every message the master stores between the new position and the old one.

Orderly consumption moves messages from the window into a "consuming" map with :meth:`take_messages` and
either :meth:`commit`\\ s them or puts them back with :meth:`make_message_to_consume_again`.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable

from broker_sim.common.message import MessageExt, Prop


class ProcessQueue:
    """Thread-safe; ``now_ms`` callables come from the consumer's clock."""

    #: client-side lock lifetime (RocketMQ REBALANCE_LOCK_MAX_LIVE_TIME); the broker's expiry is 60 s
    LOCK_MAX_LIVE_MS = 30_000

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._offsets: list[int] = []  # sorted keys of _msgs
        self._msgs: dict[int, MessageExt] = {}
        self._consuming: dict[int, MessageExt] = {}  # orderly: taken but not committed
        self._size_bytes = 0
        self.queue_offset_max = -1
        self.dropped = False
        self.locked = False
        self.last_lock_ms = 0
        self.last_pull_ms = 0
        self.last_consume_ms = 0
        self.consuming = False  # orderly: a consume task is scheduled for this queue
        # One consume thread per queue at a time (orderly): held while the listener runs.
        self.consume_lock = threading.Lock()

    # -- window ---------------------------------------------------------------------------------------------

    def put_messages(self, msgs: Iterable[MessageExt]) -> bool:
        """Add pulled messages (ignoring offsets already present). True when an orderly consume should
        start."""
        with self._lock:
            added = 0
            for msg in msgs:
                off = msg.queue_offset
                if off in self._msgs:
                    continue
                bisect.insort(self._offsets, off)
                self._msgs[off] = msg
                self._size_bytes += len(msg.body)
                self.queue_offset_max = off  # a pull's messages come in offset order: the last one
                added += 1
            dispatch = added > 0 and not self.consuming and bool(self._msgs)
            if dispatch:
                self.consuming = True
            return dispatch

    def remove_messages(self, msgs: Iterable[MessageExt]) -> int:
        """Forget finished messages; returns the offset now safe to commit (-1 if the window was empty)."""
        with self._lock:
            if not self._msgs:
                return -1
            for msg in msgs:
                removed = self._msgs.pop(msg.queue_offset, None)
                if removed is not None:
                    i = bisect.bisect_left(self._offsets, msg.queue_offset)
                    del self._offsets[i]
                    self._size_bytes -= len(removed.body)
            return self._offsets[0] if self._offsets else self.queue_offset_max + 1

    def committable_offset(self) -> int:
        """Smallest unfinished offset, or last pulled + 1 when nothing is in flight (-1 if nothing pulled)."""
        with self._lock:
            candidates = ([self._offsets[0]] if self._offsets else []) + (
                [min(self._consuming)] if self._consuming else []
            )
            if candidates:
                return min(candidates)
            return self.queue_offset_max + 1 if self.queue_offset_max >= 0 else -1

    @property
    def msg_count(self) -> int:
        with self._lock:
            return len(self._msgs) + len(self._consuming)

    @property
    def msg_size_bytes(self) -> int:
        with self._lock:
            return self._size_bytes

    def max_span(self) -> int:
        """Distance between the smallest and the largest offset in flight (flow control measure)."""
        with self._lock:
            return self._offsets[-1] - self._offsets[0] if self._offsets else 0

    def in_flight_offsets(self) -> list[int]:
        with self._lock:
            return sorted([*self._offsets, *self._consuming])

    def expired_messages(self, now_ms: int, consume_timeout_ms: int) -> list[MessageExt]:
        """Messages whose listener call started more than ``consume_timeout_ms`` ago (RocketMQ: 15 min)."""
        with self._lock:
            out = []
            for off in self._offsets:
                started = self._msgs[off].properties.get(Prop.CONSUME_START_TIME)
                if started is not None and now_ms - int(started) > consume_timeout_ms:
                    out.append(self._msgs[off])
            return out

    def clear(self) -> None:
        with self._lock:
            self._offsets.clear()
            self._msgs.clear()
            self._consuming.clear()
            self._size_bytes = 0

    # -- orderly --------------------------------------------------------------------------------------------

    def take_messages(self, batch_size: int) -> list[MessageExt]:
        """Move up to ``batch_size`` lowest-offset messages to the consuming map (orderly only)."""
        with self._lock:
            out: list[MessageExt] = []
            while self._offsets and len(out) < batch_size:
                off = self._offsets.pop(0)
                msg = self._msgs.pop(off)
                self._consuming[off] = msg
                out.append(msg)
            if not out:
                self.consuming = False
            return out

    def commit(self) -> int:
        """Orderly: the taken messages are done; returns the next offset to commit (max taken + 1, or -1)."""
        with self._lock:
            if not self._consuming:
                return -1
            top = max(self._consuming)
            for msg in self._consuming.values():
                self._size_bytes -= len(msg.body)
            self._consuming.clear()
            return top + 1

    def make_message_to_consume_again(self, msgs: Iterable[MessageExt]) -> None:
        """Orderly: put taken messages back so the next take returns them first."""
        with self._lock:
            for msg in msgs:
                if self._consuming.pop(msg.queue_offset, None) is not None:
                    bisect.insort(self._offsets, msg.queue_offset)
                    self._msgs[msg.queue_offset] = msg

    def has_pending(self) -> bool:
        with self._lock:
            return bool(self._offsets)

    def is_lock_expired(self, now_ms: int) -> bool:
        return now_ms - self.last_lock_ms > self.LOCK_MAX_LIVE_MS
