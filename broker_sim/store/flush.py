"""Getting data to disk.

* :class:`GroupCommitService` (SYNC_FLUSH): a put appends, registers "flushed up to my end offset" and waits.
  One flusher thread flushes *everything written so far* with one ``fdatasync`` and then releases every
  waiter whose end offset is covered — including puts that registered while the disk was busy but had
  appended before the flush began — so no put ever syncs on its own. A put whose end is already on disk
  returns without waiting at all. A put whose flush does not finish within ``sync_flush_timeout_ms``
  (measured on the store's clock) reports FLUSH_DISK_TIMEOUT; its data is still in the commit log.
* :class:`PeriodicFlusher`: every ``flush_interval_commit_log_ms`` flushes the commit log (ASYNC_FLUSH only),
  and every ``flush_interval_consume_queue_ms`` the consume queues and index, then rewrites the checkpoint.

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

from broker_sim.clock import Clock
from broker_sim.store.checkpoint import StoreCheckpoint
from broker_sim.store.commit_log import CommitLog

log = logging.getLogger(__name__)
MAX_GATHER_S = 0.002  # upper bound of the wait for a full group (real time, not the store's clock)
RETRY_S = 0.01  # after a failed flush (RocketMQ's GroupCommitService also retries every 10 ms)


class GroupCommitService:
    def __init__(self, commit_log: CommitLog, checkpoint: StoreCheckpoint, clock: Clock) -> None:
        self.commit_log = commit_log
        self.checkpoint = checkpoint
        self.clock = clock
        self.before_flush: Callable[[], None] | None = None
        self.flush_count = 0  # number of flush rounds (group commit makes it ≪ number of puts)
        self.in_flight = 0  # puts registered before the round in progress began
        self.largest_group = 0  # most puts one flush has released
        self.flushed = 0  # commit-log offset known to be on disk
        self._cond = threading.Condition(threading.Lock())
        self._waiters: list[tuple[int, threading.Event]] = []
        self._expected = 1  # how many waiters the last round released: the group to gather next
        self._gather_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._abandoned = False

    def start(self) -> None:
        self._stop.clear()
        self._abandoned = False
        self.flushed = self.commit_log.mfq.flushed_offset
        self._thread = threading.Thread(target=self._run, name="broker_sim-group-commit", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Puts waiting that the round in progress (if any) does not cover yet."""
        with self._cond:
            return len(self._waiters) - self.in_flight

    @property
    def waiting(self) -> int:
        """Puts waiting for their flush (the next round's and the current one's)."""
        with self._cond:
            return len(self._waiters)

    def wait_flushed(self, end_offset: int, timeout_ms: int) -> bool:
        """Block until the commit log is on disk up to ``end_offset``; False on timeout."""
        if end_offset <= self.flushed:
            return True
        done = threading.Event()
        with self._cond:
            if end_offset <= self.flushed:
                return True
            self._waiters.append((end_offset, done))
            self._cond.notify()
        return self.clock.wait(done, timeout_ms / 1000)

    def _run(self) -> None:
        cond = self._cond
        while not self._stop.is_set():
            with cond:
                cond.wait_for(lambda: self._waiters or self._stop.is_set(), 1.0)
                if self._waiters and not self._stop.is_set():
                    cond.wait_for(lambda: len(self._waiters) >= self._expected or self._stop.is_set(),
                                  self._gather_s)  # fmt: skip
            if not self._commit_round():
                self._stop.wait(RETRY_S)  # the disk failed: retry soon, without spinning on it
        if not self._abandoned:
            self._commit_round()  # release whoever is still waiting

    def _commit_round(self) -> bool:
        """One flush and the release of every waiter it covers; False when the flush failed."""
        if self._abandoned:
            return True
        with self._cond:
            self.in_flight = len(self._waiters)
            if not self._waiters:
                return True
        started = time.monotonic()
        try:
            if self.before_flush is not None:
                self.before_flush()
            end, ts = self.commit_log.last_append
            flushed = self.commit_log.flush()
            self.flush_count += 1
            if flushed >= end and ts:
                self.checkpoint.physic_msg_timestamp = ts
        except Exception:
            log.exception("group commit flush failed; %d waiting puts wait for the retry", self.in_flight)
            with self._cond:
                self.in_flight = 0
            return False
        self._gather_s = min(MAX_GATHER_S, time.monotonic() - started)
        with self._cond:
            self.flushed = max(self.flushed, flushed)
            waiters, self._waiters = self._waiters, []
            self.in_flight = 0
            released = 0
            self._expected = max(1, len(waiters))  # every producer seen around this flush
            for target, ev in waiters:
                if target <= flushed:
                    ev.set()
                    released += 1
                else:
                    self._waiters.append((target, ev))  # appended after the flush began: next round
        self.largest_group = max(self.largest_group, released)
        return True

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def abandon(self) -> None:
        """Crash: stop without flushing and release every waiting put (which then reports failure)."""
        self._abandoned = True
        self.stop()
        with self._cond:
            waiters, self._waiters = self._waiters, []
        for _, ev in waiters:
            ev.set()


class PeriodicFlusher:
    def __init__(
        self,
        clock: Clock,
        interval_ms: int,
        logics_interval_ms: int,
        flush_commit_log: Callable[[], object] | None,
        flush_logics: Callable[[], None],
    ) -> None:
        self.clock = clock
        self.interval_ms = interval_ms
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
        while not self.clock.wait(self._stop, self.interval_ms / 1000):
            try:
                if self.flush_commit_log is not None:
                    self.flush_commit_log()
                now = self.clock.now_ms()
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
