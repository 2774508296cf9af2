"""Deleting old data (RocketMQ's ``CleanCommitLogService`` + ``CleanConsumeQueueService``).

A pass deletes commit-log segments (never the one being written, at most ``delete_files_batch_max``, oldest
first, stopping at the first one that is still young) when any of these holds:

* the clock's UTC hour is in ``delete_when`` (default ``"04"``) — age rule: a segment goes once its newest
  record is older than ``file_reserved_hours`` (72);
* disk usage is above ``disk_max_used_space_ratio`` (75 %) — same age rule, at any hour;
* disk usage is above ``disk_space_clean_forcibly_ratio`` (85 %) — the oldest segments go regardless of age.

Above ``disk_space_warning_level_ratio`` (90 %) the store also marks itself disk-full: puts answer
SERVICE_NOT_AVAILABLE until a pass sees the usage drop again. After segments go, consume-queue files and index
files that only point below the new minimum commit-log offset are deleted too.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from broker_sim.clock import Clock
from broker_sim.store.commit_log import CommitLog
from broker_sim.store.config import StoreConfig
from broker_sim.store.mapped_file import MappedFile
from broker_sim.store.message_record import BLANK, BLANK_MAGIC, HEADER, MESSAGE_MAGIC
from broker_sim.store.results import ExpiryReport

log = logging.getLogger(__name__)


def default_disk_usage(path: Path) -> Callable[[], float]:
    def ratio() -> float:
        usage = shutil.disk_usage(path)
        return usage.used / usage.total if usage.total else 0.0

    return ratio


def last_store_timestamp(mf: MappedFile) -> int:
    """Store timestamp of the newest record in a segment (hops record to record by TOTALSIZE)."""
    pos, last = 0, 0
    limit = mf.wrote
    while pos + 8 <= limit:
        size, magic = BLANK.unpack_from(mf.mm, pos)
        if magic == BLANK_MAGIC or magic != MESSAGE_MAGIC or size <= 0:
            break
        last = HEADER.unpack_from(mf.mm, pos)[10]
        pos += size
    return last


class ExpiryService:
    # slots: the compiled put reads ``disk_full`` in place on every put (``codec.register_slots``)
    __slots__ = (
        "_last_ts", "_lock", "_stop", "_thread", "clean_logics", "clock", "commit_log", "config", "disk_full",
        "disk_usage",
    )  # fmt: skip

    def __init__(
        self,
        config: StoreConfig,
        clock: Clock,
        commit_log: CommitLog,
        disk_usage: Callable[[], float],
        clean_logics: Callable[[int], tuple[int, int]],
    ) -> None:
        self.config = config
        self.clock = clock
        self.commit_log = commit_log
        self.disk_usage = disk_usage
        self.clean_logics = clean_logics  # min phys offset → (consume-queue files, index files) deleted
        self.disk_full = False
        self._last_ts: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> ExpiryReport:
        with self._lock:
            return self._run()

    def _run(self) -> ExpiryReport:
        cfg = self.config
        ratio = float(self.disk_usage())
        report = ExpiryReport(disk_ratio=ratio)
        if ratio > cfg.disk_space_warning_level_ratio:
            if not self.disk_full:
                log.error("disk usage %.1f%% above %.0f%%: rejecting writes", ratio * 100,
                          cfg.disk_space_warning_level_ratio * 100)  # fmt: skip
            self.disk_full = True
            report.clean_immediately = True
        elif ratio > cfg.disk_space_clean_forcibly_ratio:
            self.disk_full = False
            report.clean_immediately = True
        else:
            self.disk_full = False
        report.disk_full = self.disk_full
        now = self.clock.now_ms()
        hour = dt.datetime.fromtimestamp(now / 1000, tz=dt.UTC).hour
        time_up = hour in cfg.delete_hours()
        space_to_delete = ratio > cfg.disk_max_used_space_ratio or ratio < 0
        if time_up or space_to_delete:
            reserved_ms = int(cfg.file_reserved_hours * 3_600_000)
            cl = self.commit_log
            with cl.lock:
                files = cl.mfq.files
                count = 0
                for mf in files[:-1]:
                    if count >= cfg.delete_files_batch_max:
                        break
                    last = self._last_ts.get(mf.file_from_offset)
                    if last is None:
                        last = self._last_ts[mf.file_from_offset] = last_store_timestamp(mf)
                    if now >= last + reserved_ms or report.clean_immediately:
                        count += 1
                    else:
                        break
                gone = cl.mfq.delete_first(count)
            for mf in gone:
                self._last_ts.pop(mf.file_from_offset, None)
                report.deleted_commit_log_files.append(mf.path.name)
                log.info("expiry: deleted commit-log segment %s", mf.path.name)
        report.min_phy_offset = self.commit_log.min_offset
        if report.deleted_commit_log_files:
            report.deleted_consume_queue_files, report.deleted_index_files = self.clean_logics(
                report.min_phy_offset
            )
        return report

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="broker_sim-expiry", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self.clock.wait(self._stop, self.config.clean_resource_interval_ms / 1000):
            try:
                self.run_once()
            except Exception:
                log.exception("expiry pass failed; retrying next interval")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
