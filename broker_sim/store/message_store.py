"""The storage engine's facade (RocketMQ's ``DefaultMessageStore``): what the broker's messaging layer calls.

Layout of ``store_dir``::

    commitlog/00000000000000000000 …      fixed-size mapped segments, named by start offset
    consumequeue/{topic}/{queueId}/…      20-byte units, built from the commit log by the dispatcher
    index/yyyyMMddHHmmssSSS               hash-slot index by key
    checkpoint, abort, config/*.json      (config files: see :mod:`broker_sim.store.config_files`)

Delayed messages go to ``SCHEDULE_TOPIC_XXXX`` as in RocketMQ (:func:`.message_record.schedule_rewrite`); the
messaging layer's schedule service re-puts them to the real topic, without ``DELAY``, when due.

Crash simulation (:meth:`MessageStore.crash`): stop every thread without flushing, zero every byte of the
commit log and consume queues past what was last flushed to disk (what a power cut loses from the page
cache), keep the ``abort`` marker, and write no checkpoint; the next ``start()`` runs abnormal recovery.
Under SYNC_FLUSH nothing acknowledged is lost; under ASYNC_FLUSH what was not flushed yet is (less than
``flush_commit_log_least_pages`` dirty pages, for up to the thorough interval: 4 pages, 10 s, as RocketMQ).
(A real ``kill -9`` of the process loses nothing from the page cache; the subprocess tests cover that case.)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from broker_sim.clock import Clock, SystemClock
from broker_sim.store.checkpoint import AbortFile, StoreCheckpoint
from broker_sim.store.commit_log import CommitLog
from broker_sim.store.config import FlushDiskType, StoreConfig
from broker_sim.store.consume_queue import ConsumeQueue
from broker_sim.store.dispatcher import Dispatcher, TagsCodeHook
from broker_sim.store.expiry import ExpiryService, default_disk_usage
from broker_sim.store.flush import GroupCommitService, PeriodicFlusher
from broker_sim.store.ha.replication import Replication
from broker_sim.store.index_service import IndexService
from broker_sim.store.message_record import (
    MessageInner,
    host_bytes,
)
from broker_sim.store.prefault import Prefaulter
from broker_sim.store.put_path import PutFn, PutPath
from broker_sim.store.reader import StoreReader
from broker_sim.store.recovery import choose_start, count_dirty_bytes, scan_commit_log
from broker_sim.store.results import (
    AppendMessageResult,
    DispatchListener,
    ExpiryReport,
    PutMessageResult,
    PutMessageStatus,
    RecoveryReport,
)
from broker_sim.store.zero_ahead import ZeroAhead

log = logging.getLogger(__name__)
_PUT_OK = PutMessageStatus.PUT_OK
_MAX_TS = 2**63 - 1
_T = TypeVar("_T")
_Appended = AppendMessageResult | PutMessageResult


class MessageStore:
    """One store directory. Thread-safe: any number of threads may put and get concurrently."""

    def __init__(self, store_dir: str | Path, config: StoreConfig | None = None, clock: Clock | None = None):
        self.store_dir = Path(store_dir)
        self.config = config or StoreConfig()
        self.clock: Clock = clock or SystemClock()
        cfg = self.config
        self.store_host = host_bytes(cfg.store_host)
        self.commit_log = CommitLog(
            self.store_dir / "commitlog",
            cfg.commit_log_file_size,
            cfg.max_message_size,
            self.store_host,
            self.clock,
        )
        self.index: IndexService | None = None
        if cfg.message_index_enable:
            self.index = IndexService(
                self.store_dir / "index", cfg.index_hash_slots, cfg.index_max_entries, self.clock
            )
        self._cqs: dict[tuple[str, int], ConsumeQueue] = {}
        self._cq_lock = threading.Lock()
        self.dispatcher = Dispatcher(
            self.commit_log, self.find_consume_queue, self.index, cfg.delay_levels_ms
        )
        self.prefaulter = Prefaulter(self.commit_log)
        self.zero_ahead = ZeroAhead(self.commit_log)
        self.checkpoint = StoreCheckpoint(self.store_dir / "checkpoint")
        self.abort_file = AbortFile(self.store_dir / "abort")
        self.group_commit = GroupCommitService(self.commit_log, self.checkpoint, self.clock)
        self.group_commit.before_flush = cfg.before_flush
        sync = cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH
        self.flusher = PeriodicFlusher(
            self.clock, cfg.flush_interval_commit_log_ms, cfg.flush_interval_consume_queue_ms,
            None if sync else self._flush_commit_log, self._flush_logics,
            least_pages=cfg.flush_commit_log_least_pages,
            thorough_interval_ms=cfg.flush_commit_log_thorough_interval_ms,
        )  # fmt: skip
        usage = cfg.disk_usage or default_disk_usage(self.store_dir)
        self.expiry = ExpiryService(cfg, self.clock, self.commit_log, usage, self._clean_logics)
        self.recovery_report = RecoveryReport()
        self.replication = Replication(cfg, self.commit_log, self.dispatcher.wake)
        self.put_path = PutPath(
            cfg, self.commit_log, self.dispatcher, self.group_commit, self.replication, self.expiry
        )
        #: Append one message. Expected failures come back as a status (MESSAGE_ILLEGAL for a bad topic or
        #: an oversized body, PROPERTIES_SIZE_EXCEEDED, SERVICE_NOT_AVAILABLE when stopped or the disk is
        #: full, FLUSH_DISK_TIMEOUT when a sync flush is late — the message is stored all the same).
        self.put_message: PutFn = self.put_path.put_message
        self.reader = StoreReader(cfg, self.commit_log, self.index, self._cqs, lambda: self.put_path.running)
        r = self.reader
        self.get_message = r.get_message
        self.select_one_message_by_offset = r.select_one_message_by_offset
        self.look_message_by_offset = r.look_message_by_offset
        self.query_message = r.query_message
        self.get_max_offset_in_queue = r.get_max_offset_in_queue
        self.get_min_offset_in_queue = r.get_min_offset_in_queue
        self.get_commit_log_offset_in_queue = r.get_commit_log_offset_in_queue
        self.get_message_store_timestamp = r.get_message_store_timestamp
        self.check_in_disk_by_consume_offset = r.check_in_disk_by_consume_offset
        self.consume_queue_units = r.consume_queue_units
        self.get_earliest_message_time = r.get_earliest_message_time
        self.get_offset_in_queue_by_time = r.get_offset_in_queue_by_time
        self.topic_queue_ids = r.topic_queue_ids

    @property
    def max_phy_offset(self) -> int:
        return self.commit_log.max_offset

    @property
    def min_phy_offset(self) -> int:
        return self.commit_log.min_offset

    @property
    def config_dir(self) -> Path:
        """Where ``topics.json`` & co. live (see :mod:`broker_sim.store.config_files`)."""
        return self.store_dir / "config"

    @property
    def running(self) -> bool:
        return self.put_path.running

    # ================================================================================== lifecycle
    def start(self) -> RecoveryReport:
        """Load files, recover (normally or, if ``abort`` exists, abnormally), rebuild what is missing,
        create ``abort`` and start the background services. Raises CorruptRecordError (see recovery)."""
        if self.put_path.running:
            return self.recovery_report
        for sub in ("commitlog", "consumequeue", "index", "config"):
            (self.store_dir / sub).mkdir(parents=True, exist_ok=True)
        try:
            report = self._recover()
        except BaseException:
            self._close()
            raise
        self.recovery_report = report
        self.abort_file.create()
        self.put_path.running = True
        self.put_path.crashed = False
        self.dispatcher.start()
        warm = self.config.warm_mapped_file
        sync = self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        if warm is None:  # SYNC_FLUSH: writing zeros ahead is asked for (twice the bytes for ≈ 5–10 % puts/s)
            warm = not sync and self.prefaulter.compiled
        if warm:
            (self.zero_ahead if sync else self.prefaulter).start()
        self.group_commit.start()
        self.flusher.start()
        self.expiry.start()
        self.replication.start()
        return report

    def _recover(self) -> RecoveryReport:
        cfg = self.config
        abnormal = self.abort_file.exists()
        self.checkpoint.reload()
        report = RecoveryReport(abnormal=abnormal)
        cl = self.commit_log
        cl.dispatch_hints.clear()  # hints left by appends before a crash() may point at discarded bytes
        cl.mfq.load()
        self._load_consume_queues()
        reindex_from = -1
        if self.index is not None:
            reindex_from = self.index.load(not abnormal, self.checkpoint.index_msg_timestamp)
        files = cl.mfq.files
        start = choose_start(
            files,
            abnormal,
            self.checkpoint.min_timestamp(with_index=False),  # RocketMQ's messageIndexSafe=false
            cfg.normal_recover_segments,
        )
        end = scan_commit_log(cl, start, cfg.truncate_corrupt_middle, report)
        report.truncated_bytes = count_dirty_bytes(cl, end)
        if files:
            cl.mfq.truncate(end)
        scan_start = files[start].file_from_offset if files else 0
        for cq in self._cqs.values():
            cq.truncate_dirty(end)
        d = self.dispatcher
        if reindex_from >= 0 and reindex_from < scan_start:
            d.reput_offset = reindex_from
            d.dispatch_pending(notify=False, end=scan_start, build_cq=False)
        if abnormal:
            d.reput_offset = scan_start
        else:
            ends = [cq.max_phys_end for cq in self._cqs.values() if cq.max_phys_end]
            d.reput_offset = min(end, max(ends, default=cl.min_offset))
        report.redispatched = d.dispatch_pending(notify=False)
        report.max_phy_offset = end
        cl.topic_queue_table = {key: cq.max_offset for key, cq in self._cqs.items()}
        cl.last_append = (end, d.last_store_timestamp)
        for cq in self._cqs.values():
            cq.delete_expired(cl.min_offset)
        if abnormal:
            log.warning("abnormal recovery of %s: %s", self.store_dir, report)
        return report

    def _load_consume_queues(self) -> None:
        root = self.store_dir / "consumequeue"
        for topic_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            for qdir in sorted(p for p in topic_dir.iterdir() if p.is_dir() and p.name.isdigit()):
                cq = ConsumeQueue(root, topic_dir.name, int(qdir.name), self.config.consume_queue_units)
                cq.load_and_recover()
                self._cqs[(topic_dir.name, int(qdir.name))] = cq

    def shutdown(self) -> None:
        """Clean stop: dispatch what is pending, flush everything, write the checkpoint, remove ``abort``."""
        if not self.put_path.running:
            return
        self.put_path.running = False
        self.replication.stop()
        self.expiry.stop()
        self.flusher.stop()
        self.group_commit.stop()
        self.prefaulter.stop()
        self.zero_ahead.stop()
        self.dispatcher.stop()
        self.dispatcher.dispatch_pending()
        self._flush_commit_log()
        self._flush_logics(with_index=True)
        self._close()
        self.abort_file.remove()

    def crash(self) -> None:
        """Fault injection: stop as a power cut would (see the module docstring)."""
        if not self.put_path.running:
            return
        self.put_path.running = False
        self.put_path.crashed = True
        self.replication.stop()
        self.expiry.stop()
        self.flusher.stop()
        self.group_commit.abandon()
        self.prefaulter.stop()
        self.zero_ahead.stop()
        self.dispatcher.stop()
        self.commit_log.mfq.discard_unflushed()
        with self._cq_lock:
            for cq in self._cqs.values():
                cq.mfq.discard_unflushed()
        self._close()

    def _close(self) -> None:
        self.commit_log.mfq.close()
        with self._cq_lock:
            for cq in self._cqs.values():
                cq.close()
            self._cqs.clear()
        if self.index is not None:
            self.index.close()
            self.index.files = []
        self.commit_log.mfq.files = []

    def __enter__(self) -> MessageStore:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ================================================================================== flush
    def _flush_commit_log(self, least_pages: int = 0) -> int:
        end, ts = self.commit_log.last_append
        flushed = self.commit_log.flush(least_pages)
        if flushed >= end and ts > self.checkpoint.physic_msg_timestamp:
            self.checkpoint.physic_msg_timestamp = ts
        return flushed

    def _flush_logics(self, with_index: bool = False) -> None:
        """Flush consume queues (and, at shutdown, the index) and rewrite the checkpoint.

        Like RocketMQ, the index is not flushed periodically — only when a file fills up (on the roll) and
        at shutdown: flushing it means writing back pages scattered over its 20 MB slot table, and every
        later put touching a cleaned page faults again. After a crash, index files newer than the
        checkpoint's index timestamp are deleted and rebuilt from the commit log instead."""
        ts = self.dispatcher.last_store_timestamp
        with self._cq_lock:
            cqs = list(self._cqs.values())
        for cq in cqs:
            cq.flush()
        if ts > self.checkpoint.logics_msg_timestamp:
            self.checkpoint.logics_msg_timestamp = ts
        if self.index is not None:
            its = self.index.flush() if with_index else self.index.flushed_timestamp
            if its > self.checkpoint.index_msg_timestamp:
                self.checkpoint.index_msg_timestamp = its
        self.checkpoint.flush()

    def flush(self) -> int:
        """Flush commit log, consume queues, index and checkpoint now; returns the flushed log offset."""
        flushed = self._flush_commit_log()
        self._flush_logics(with_index=True)
        return flushed

    # ================================================================================== put
    # put_message (an attribute: the compiled one-call put or PutPath.put_general) is bound in __init__
    def put_messages(self, msgs: Sequence[MessageInner]) -> PutMessageResult:
        """Append several messages contiguously and atomically (all or none are validated and written);
        ``append_result`` covers the batch (``msg_num``, ``offsets``, ``msg_ids``, first queue offset)."""
        return self.put_path.put_messages(msgs)

    # ================================================================================== queues
    def find_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The consume queue of topic/queue, created (empty) on first use."""
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            with self._cq_lock:
                cq = self._cqs.get((topic, queue_id))
                if cq is None:
                    cq = ConsumeQueue(
                        self.store_dir / "consumequeue", topic, queue_id, self.config.consume_queue_units
                    )
                    self._cqs[(topic, queue_id)] = cq
        return cq

    # ================================================================================== dispatch
    def add_dispatch_listener(self, listener: DispatchListener) -> None:
        """Call ``listener(DispatchRequest)`` (on the dispatching thread) after each record's consume-queue
        unit and index entries are written — e.g. to wake long polls or a schedule service. A listener
        that raises is logged and counted, never fatal. Not called for records re-dispatched by recovery."""
        self.dispatcher.listeners.append(listener)

    def remove_dispatch_listener(self, listener: DispatchListener) -> None:
        if listener in self.dispatcher.listeners:
            self.dispatcher.listeners.remove(listener)

    def set_tags_code_hook(self, hook: TagsCodeHook | None) -> None:
        """Override consume-queue tag codes: ``hook(topic, properties, store_ts)`` → code, or None for the
        default (tag hash; delivery time on the schedule topic)."""
        self.dispatcher.tags_code_hook = hook

    def dispatch_pending(self) -> int:
        """Dispatch everything appended so far, now, in this thread (deterministic tests)."""
        return self.dispatcher.dispatch_pending()

    def wait_dispatched(self, timeout_s: float = 5.0) -> bool:
        """Wait (real time) until everything appended before this call is dispatched."""
        return self.dispatcher.wait_dispatched(self.commit_log.max_offset, timeout_s)

    def dispatch_behind_bytes(self) -> int:
        return self.dispatcher.behind()

    # ================================================================================== expiry
    def run_expiry(self) -> ExpiryReport:
        """One pass of the expiry service now (it also runs every ``clean_resource_interval_ms``)."""
        return self.expiry.run_once()

    @property
    def is_disk_full(self) -> bool:
        return self.expiry.disk_full

    def _clean_logics(self, min_phys: int) -> tuple[int, int]:
        with self._cq_lock:
            cqs = list(self._cqs.values())
        cq_files = sum(cq.delete_expired(min_phys) for cq in cqs)
        idx_files = self.index.delete_below(min_phys) if self.index is not None else 0
        return cq_files, idx_files
