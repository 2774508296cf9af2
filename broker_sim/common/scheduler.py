"""Timers on a :class:`~broker_sim.clock.Clock`: one thread running due callbacks in time order.

Every periodic or delayed job of the broker and the clients (offset persistence every 5 s, rebalance every
20 s, queue re-lock every 20 s, transaction check-back every 60 s, orderly local retry, pull back-off) goes
through a Scheduler, so that under a ManualClock a test decides when they happen. Periodic jobs run on a fixed
grid (initial delay + k × period) and never "catch up" missed runs in a burst: advancing a ManualClock by two
hours runs a 5 s job once or twice, as a stalled process would.

A job that raises is logged with its traceback and counted in ``errors``; periodic jobs keep their schedule.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from broker_sim.clock import Clock

log = logging.getLogger(__name__)


@dataclass(order=True)
class _Job:
    due_ms: int
    seq: int
    fn: Callable[[], None] = field(compare=False)
    period_ms: int = field(compare=False, default=0)
    name: str = field(compare=False, default="")
    cancelled: bool = field(compare=False, default=False)


class Handle:
    """Returned by :meth:`Scheduler.schedule`; ``cancel()`` stops a pending or periodic job."""

    def __init__(self, job: _Job) -> None:
        self._job = job

    def cancel(self) -> None:
        self._job.cancelled = True


class Scheduler:
    def __init__(self, clock: Clock, name: str) -> None:
        self.clock = clock
        self.name = name
        self.errors = 0
        self._heap: list[_Job] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"sched-{name}", daemon=True)
        self._thread.start()

    def schedule(self, delay_ms: int, fn: Callable[[], None], *, name: str = "") -> Handle:
        """Run ``fn`` once, ``delay_ms`` from now on the clock."""
        return self._add(delay_ms, fn, 0, name)

    def schedule_periodic(
        self, initial_delay_ms: int, period_ms: int, fn: Callable[[], None], *, name: str = ""
    ) -> Handle:
        """Run ``fn`` after ``initial_delay_ms`` and then every ``period_ms`` after each run ends."""
        if period_ms <= 0:
            raise ValueError("period_ms must be positive")
        return self._add(initial_delay_ms, fn, period_ms, name)

    def _add(self, delay_ms: int, fn: Callable[[], None], period_ms: int, name: str) -> Handle:
        job = _Job(
            self.clock.now_ms() + max(0, delay_ms), next(self._seq), fn, period_ms, name or fn.__name__
        )
        with self._lock:
            if self._stopped:
                job.cancelled = True
                return Handle(job)
            heapq.heappush(self._heap, job)
        self._wake.set()
        return Handle(job)

    def shutdown(self, wait: bool = True) -> None:
        with self._lock:
            self._stopped = True
            self._heap.clear()
        self._wake.set()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stopped:
                    return
                while self._heap and self._heap[0].cancelled:
                    heapq.heappop(self._heap)
                job = self._heap[0] if self._heap else None
                now = self.clock.now_ms()
                if job is not None and job.due_ms <= now:
                    heapq.heappop(self._heap)
                else:
                    self._wake.clear()
                    job = None
                    wait_s = 3600.0 if not self._heap else (self._heap[0].due_ms - now) / 1000
            if job is None:
                self.clock.wait(self._wake, wait_s)
                continue
            try:
                job.fn()
            except Exception:
                self.errors += 1
                log.exception("scheduler %s: job %s failed", self.name, job.name)
            if job.period_ms and not job.cancelled:
                with self._lock:
                    if not self._stopped:
                        # Anchored to the schedule, skipping runs that were missed entirely: the next run is
                        # the first multiple of the period at or after now (a job that overran, or a clock
                        # advanced by hours, gets one run, not a burst).
                        now = self.clock.now_ms()
                        periods = max(1, -(-(now - job.due_ms) // job.period_ms))
                        job.due_ms += periods * job.period_ms
                        job.seq = next(self._seq)
                        heapq.heappush(self._heap, job)
