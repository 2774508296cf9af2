"""Getting data to disk.

* :class:`GroupCommitService` (SYNC_FLUSH): a put appends, registers "flushed up to my end offset" and waits.
  One flusher thread flushes *everything written so far* with one ``fdatasync`` and then releases every
  waiter whose end offset is covered — including puts that registered while the disk was busy but had
  appended before the flush began — so no put ever syncs on its own. A put whose end is already on disk
  returns without waiting at all. A put whose flush does not finish within ``sync_flush_timeout_ms``
  (measured on the store's clock) reports FLUSH_DISK_TIMEOUT; its data is still in the commit log.
* :class:`PeriodicFlusher`: every ``flush_interval_commit_log_ms`` flushes the commit log (ASYNC_FLUSH only)
  when at least ``flush_commit_log_least_pages`` pages are dirty, and all of it every
  ``flush_commit_log_thorough_interval_ms`` (RocketMQ's FlushRealTimeService: 500 ms, 4 pages, 10 s), and
  every ``flush_interval_consume_queue_ms`` the consume queues and index, then rewrites the checkpoint.

Why the flusher gathers before it syncs: without it, producers split into two cohorts that alternate —
the ones released by one flush append while the next flush (serving the others) is already on the disk,
so each flush covers about half the producers (bench a2 measured ≈ 7.5 of 16). After a flush the flusher
therefore waits until as many puts are waiting as were waiting when it released the last group (served
or not), or a gather time (at most
the last flush's own duration, so a lone put's latency at most doubles when producers go away) — what
PostgreSQL's ``commit_delay``/``commit_siblings`` do, but adaptive, with no setting to tune.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from broker_sim.clock import Clock, SystemClock
from broker_sim.store import codec
from broker_sim.store.checkpoint import StoreCheckpoint
from broker_sim.store.commit_log import CommitLog

log = logging.getLogger(__name__)
MAX_GATHER_S = 0.002  # upper bound of the wait for a full group (real time, not the store's clock)
RETRY_S = 0.01  # after a failed flush (RocketMQ's GroupCommitService also retries every 10 ms)


class PyFlushGate:
    """Where SYNC_FLUSH puts wait for the group-commit thread (the pure-Python twin of the compiled
    ``_codec.FlushGate``, used without the extension or on a clock other than the system clock: a waiter
    sleeps on its own Event through ``clock.wait`` so that timeouts follow the store's clock)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._flushed = 0
        self._cond = threading.Condition(threading.Lock())
        self._waiters: list[tuple[int, threading.Event]] = []
        self._expected = 1  # how many waiters the last release saw: the group to gather next
        self._stopping = False
        self._abandoned = False

    @property
    def flushed(self) -> int:
        """Commit-log offset known to be on disk."""
        return self._flushed

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._waiters)

    def wait(self, end_offset: int, timeout_s: float) -> bool:
        """Block until flushed up to ``end_offset`` (True), abandoned (True), or timed out (False)."""
        done = threading.Event()
        with self._cond:
            if end_offset <= self._flushed or self._abandoned:
                return True
            waiters = self._waiters
            waiters.append((end_offset, done))
            if len(waiters) == 1 or len(waiters) >= self._expected:
                self._cond.notify()  # wake the flusher only when it has something to do
        if self.clock.wait(done, timeout_s):
            return True
        with self._cond:
            if (end_offset, done) in self._waiters:
                self._waiters.remove((end_offset, done))
            return done.is_set()

    def gather(self, idle_s: float, gather_s: float) -> int:
        """Flusher: wait up to ``idle_s`` for a first waiter, then up to ``gather_s`` for as many as the last
        release saw; how many are registered (0: idle or stopping)."""
        with self._cond:
            self._cond.wait_for(lambda: self._waiters or self._stopping, idle_s)
            if self._waiters and not self._stopping:
                self._cond.wait_for(lambda: len(self._waiters) >= self._expected or self._stopping, gather_s)
            return 0 if self._stopping else len(self._waiters)

    def release(self, flushed: int) -> int:
        """Flusher, after a flush: wake every waiter it covers; how many that is."""
        with self._cond:
            self._flushed = max(self._flushed, flushed)
            waiters, self._waiters = self._waiters, []
            self._expected = max(1, len(waiters))
            for target, ev in waiters:
                if target <= self._flushed:
                    ev.set()
                else:
                    self._waiters.append((target, ev))  # appended after the flush began: next round
            return len(waiters) - len(self._waiters)

    def reset(self, flushed: int) -> None:
        with self._cond:
            self._flushed = flushed
            self._waiters, self._expected = [], 1
            self._stopping = self._abandoned = False

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def abandon(self) -> None:
        with self._cond:
            self._stopping = self._abandoned = True
            waiters, self._waiters = self._waiters, []
            self._cond.notify_all()
        for _, ev in waiters:
            ev.set()


class FlushGate(Protocol):
    """What :class:`PyFlushGate` and the compiled ``_codec.FlushGate`` both offer."""

    @property
    def flushed(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    def wait(self, end_offset: int, timeout_s: float) -> bool: ...
    def gather(self, idle_s: float, gather_s: float) -> int: ...
    def release(self, flushed: int) -> int: ...
    def reset(self, flushed: int) -> None: ...
    def stop(self) -> None: ...
    def abandon(self) -> None: ...


def new_gate(clock: Clock) -> FlushGate:
    """The compiled gate on the system clock when the extension is built; else :class:`PyFlushGate`."""
    if codec.compiled is not None and type(clock) is SystemClock:
        gate: FlushGate = codec.compiled.FlushGate()
        return gate
    return PyFlushGate(clock)


class GroupCommitService:
    def __init__(self, commit_log: CommitLog, checkpoint: StoreCheckpoint, clock: Clock) -> None:
        self.commit_log = commit_log
        self.checkpoint = checkpoint
        self.clock = clock
        self.before_flush: Callable[[], None] | None = None
        #: called as each round starts, before its flush: the put path wakes the dispatcher here (once per
        #: round rather than once per put: every put the round covers has appended by then)
        self.before_round: Callable[[], None] | None = None
        self.flush_count = 0  # number of flush rounds (group commit makes it ≪ number of puts)
        self.in_flight = 0  # puts registered before the round in progress began
        self.largest_group = 0  # most puts one flush has released
        self.gate: FlushGate = new_gate(clock)
        self._gather_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._abandoned = False

    def start(self) -> None:
        self._stop.clear()
        self._abandoned = False
        self.gate.reset(self.commit_log.mfq.flushed_offset)
        self._thread = threading.Thread(target=self._run, name="broker_sim-group-commit", daemon=True)
        self._thread.start()

    @property
    def flushed(self) -> int:
        """Commit-log offset known to be on disk."""
        return self.gate.flushed

    @property
    def pending(self) -> int:
        """Puts waiting that the round in progress (if any) does not cover yet."""
        return max(0, self.waiting - self.in_flight)

    @property
    def waiting(self) -> int:
        """Puts waiting for their flush (the next round's and the current one's)."""
        return self.gate.waiting

    def wait_flushed(self, end_offset: int, timeout_ms: int) -> bool:
        """Block until the commit log is on disk up to ``end_offset``; False on timeout."""
        return self.gate.wait(end_offset, timeout_ms / 1000)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.gate.gather(1.0, self._gather_s) and not self._commit_round():
                self._stop.wait(RETRY_S)  # the disk failed: retry soon, without spinning on it
        if not self._abandoned:
            self._commit_round()  # release whoever is still waiting

    def _commit_round(self) -> bool:
        """One flush and the release of every waiter it covers; False when the flush failed."""
        if self._abandoned:
            return True
        self.in_flight = self.gate.waiting
        if not self.in_flight:
            return True
        started = time.monotonic()
        try:
            if self.before_round is not None:
                self.before_round()
            if self.before_flush is not None:
                self.before_flush()
            end, ts = self.commit_log.last_append
            flushed = self.commit_log.flush()
            self.flush_count += 1
            if flushed >= end and ts:
                self.checkpoint.physic_msg_timestamp = ts
        except Exception:
            log.exception("group commit flush failed; %d waiting puts wait for the retry", self.in_flight)
            self.in_flight = 0
            return False
        self._gather_s = min(MAX_GATHER_S, time.monotonic() - started)
        released = self.gate.release(flushed)
        self.in_flight = 0
        self.largest_group = max(self.largest_group, released)
        return True

    def stop(self) -> None:
        self._stop.set()
        self.gate.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def abandon(self) -> None:
        """Crash: stop without flushing and release every waiting put (which then reports failure)."""
        self._abandoned = True
        self.gate.abandon()
        self.stop()


class PeriodicFlusher:
    def __init__(
        self,
        clock: Clock,
        interval_ms: int,
        logics_interval_ms: int,
        flush_commit_log: Callable[[int], object] | None,
        flush_logics: Callable[[], None],
        *,
        least_pages: int = 0,
        thorough_interval_ms: int = 0,
    ) -> None:
        self.clock = clock
        self.interval_ms = interval_ms
        self.least_pages = least_pages
        self.thorough_interval_ms = thorough_interval_ms
        self.logics_interval_ms = logics_interval_ms
        self.flush_commit_log = flush_commit_log
        self.flush_logics = flush_logics
        self.rounds = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="broker_sim-flusher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last_logics = self.clock.now_ms()
        last_thorough: int | None = None  # the first round flushes everything (RocketMQ starts it at 0)
        while not self.clock.wait(self._stop, self.interval_ms / 1000):
            try:
                now = self.clock.now_ms()
                if self.flush_commit_log is not None:
                    least = self.least_pages
                    if last_thorough is None or now - last_thorough >= self.thorough_interval_ms:
                        least, last_thorough = 0, now
                    self.flush_commit_log(least)
                if now - last_logics >= self.logics_interval_ms:
                    self.flush_logics()
                    last_logics = now
                self.rounds += 1
            except Exception:
                log.exception("periodic flush failed; retrying next interval")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
