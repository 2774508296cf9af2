"""Clocks: every timer in broker_sim (store timestamps, expiry, delay levels, retries, offset persistence,
rebalance, transaction check-back) reads time through a :class:`Clock`, so a test can swap in a
:class:`ManualClock` and advance hours in milliseconds.

``wait(event, timeout)`` is the only way broker_sim code blocks on time: on the system clock it is
``Event.wait``; on the manual clock it returns as soon as the event is set *or* the clock has been advanced
past the deadline, so long polls and schedulers stay deterministic under test.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (RocketMQ stores ms timestamps)."""
        ...

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Block until ``event`` is set or ``timeout_s`` of *this clock's* time passes; True if set."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        return event.wait(max(0.0, timeout_s))


class ManualClock:
    """A clock that moves only when told to. Thread-safe; waiters wake when their deadline is passed."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._cond = threading.Condition()

    def now_ms(self) -> int:
        with self._cond:
            return self._now

    def advance(self, seconds: float = 0.0, *, ms: int = 0) -> int:
        """Move time forward and wake every waiter whose deadline has passed; returns the new time."""
        if seconds < 0 or ms < 0:
            raise ValueError("a clock only moves forward")
        with self._cond:
            self._now += int(seconds * 1000) + ms
            self._cond.notify_all()
            return self._now

    def set(self, now_ms: int) -> None:
        with self._cond:
            if now_ms < self._now:
                raise ValueError("a clock only moves forward")
            self._now = now_ms
            self._cond.notify_all()

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        with self._cond:
            deadline = self._now + int(timeout_s * 1000)
        # Poll the event in short real-time slices so a set() from another thread is seen promptly even
        # though Event has no hook into our condition; time itself only moves through advance().
        while True:
            if event.is_set():
                return True
            with self._cond:
                if self._now >= deadline:
                    return event.is_set()
                self._cond.wait(0.005)
