"""Getting data to disk.

* :class:`GroupCommitService` (SYNC_FLUSH): a put appends, registers "flushed up to my end offset" and waits.
  One flusher thread takes *all* waiting requests, runs a single ``msync`` covering them, and releases them
  together — the group commit that lets N concurrent producers share one disk flush. A put whose flush does
  not finish within ``sync_flush_timeout_ms`` (measured on the store's clock) reports FLUSH_DISK_TIMEOUT;
  its data is still in the commit log.
* :class:`PeriodicFlusher`: every ``flush_interval_commit_log_ms`` flushes the commit log (ASYNC_FLUSH only),
  and every ``flush_interval_consume_queue_ms`` the consume queues and index, then rewrites the checkpoint.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from broker_sim.clock import Clock
from broker_sim.store.checkpoint import StoreCheckpoint
from broker_sim.store.commit_log import CommitLog

log = logging.getLogger(__name__)


class GroupCommitService:
    def __init__(self, commit_log: CommitLog, checkpoint: StoreCheckpoint, clock: Clock) -> None:
        self.commit_log = commit_log
        self.checkpoint = checkpoint
        self.clock = clock
        self.before_flush: Callable[[], None] | None = None
        self.flush_count = 0  # number of flush rounds (group commit makes it ≪ number of puts)
        self.in_flight = 0  # puts served by the round in progress
        self.largest_group = 0  # most puts one flush has served
        self._lock = threading.Lock()
        self._requests: list[tuple[int, threading.Event]] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._abandoned = False

    def start(self) -> None:
        self._stop.clear()
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, name="broker_sim-group-commit", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Puts waiting for the next flush round (tests use it to line up a group)."""
        with self._lock:
            return len(self._requests)

    @property
    def waiting(self) -> int:
        """Puts waiting for the next round or served by the current one."""
        with self._lock:
            return len(self._requests) + self.in_flight

    def wait_flushed(self, end_offset: int, timeout_ms: int) -> bool:
        """Block until the commit log is on disk up to ``end_offset``; False on timeout."""
        done = threading.Event()
        with self._lock:
            self._requests.append((end_offset, done))
        self._wake.set()
        return self.clock.wait(done, timeout_ms / 1000)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            self._commit_round()
        if not self._abandoned:
            self._commit_round()  # release whoever is still waiting

    def _commit_round(self) -> None:
        if self._abandoned:
            return
        with self._lock:
            requests, self._requests = self._requests, []
            self.in_flight = len(requests)
        if not requests:
            return
        self.largest_group = max(self.largest_group, len(requests))
        try:
            if self.before_flush is not None:
                self.before_flush()
            end, ts = self.commit_log.last_append
            flushed = self.commit_log.flush()
            self.flush_count += 1
            if flushed >= end and ts:
                self.checkpoint.physic_msg_timestamp = ts
        except Exception:
            log.exception("group commit flush failed; %d waiting puts will time out", len(requests))
            return
        finally:
            self.in_flight = 0
        pending: list[tuple[int, threading.Event]] = []
        for target, ev in requests:
            if target <= flushed:
                ev.set()
            else:
                pending.append((target, ev))
        if pending:  # appended after our snapshot: next round
            with self._lock:
                self._requests[:0] = pending
            self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def abandon(self) -> None:
        """Crash: stop without flushing and release every waiting put (which then reports failure)."""
        self._abandoned = True
        self.stop()
        with self._lock:
            requests, self._requests = self._requests, []
        for _, ev in requests:
            ev.set()


class PeriodicFlusher:
    def __init__(
        self,
        clock: Clock,
        interval_ms: int,
        logics_interval_ms: int,
        flush_commit_log: Callable[[], None] | None,
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
