"""The index files of a store (``index/``): builds entries for each dispatched record, answers key
queries newest first across files, rolls when a file is full, drops files below the commit log's minimum.

Keys are ``topic#UNIQ_KEY`` and ``topic#<each KEYS token>``; rollback transaction records are not indexed.
A record at or below the newest file's ``endPhyOffset`` is skipped, which makes re-dispatch after recovery
idempotent.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from broker_sim.clock import Clock
from broker_sim.store import codec
from broker_sim.store.index_file import IndexFile, index_key_hash
from broker_sim.store.mapped_file import fsync_dir
from broker_sim.store.message_record import KEY_SEPARATOR, java_hash_concat, java_string_hash

#: ``java_hash_concat``, compiled when the extension is built (the index hashes every key it dispatches)
_hash_concat: Callable[[int, str], int] = (
    codec.compiled.java_hash_concat if codec.compiled is not None else java_hash_concat
)

log = logging.getLogger(__name__)


def index_file_name(ms: int) -> str:
    t = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return t.strftime("%Y%m%d%H%M%S") + f"{ms % 1000:03d}"


class IndexService:
    def __init__(self, directory: Path, hash_slots: int, max_entries: int, clock: Clock) -> None:
        self.directory = directory
        self.hash_slots = hash_slots
        self.max_entries = max_entries
        self.clock = clock
        self.files: list[IndexFile] = []
        self.lock = threading.Lock()
        self._end_phy = -1
        self._prefix_hashes: dict[str, int] = {}
        self.flushed_timestamp = 0  # end timestamp of the newest index data known to be on disk

    def load(self, last_exit_ok: bool, checkpoint_index_ts: int) -> int:
        """Map existing files. After an unclean stop, files written after the last index checkpoint may
        hold entries for data recovery is about to cut, so they are deleted (their records get
        re-indexed); returns the smallest ``beginPhyOffset`` of a deleted file (-1 if none)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.flushed_timestamp = checkpoint_index_ts
        reindex_from = -1
        for path in sorted(p for p in self.directory.iterdir() if p.is_file() and p.name.isdigit()):
            f = IndexFile(path, self.hash_slots, self.max_entries)
            if not last_exit_ok and f.end_timestamp > checkpoint_index_ts:
                begin = f.begin_phy_offset if f.index_count > 1 else -1
                f.close()
                f.destroy()
                if begin >= 0 and (reindex_from < 0 or begin < reindex_from):
                    reindex_from = begin
                log.warning("index file %s is newer than the checkpoint: deleted, will be rebuilt", path.name)
                continue
            self.files.append(f)
        self._end_phy = self._compute_end_phy()
        return reindex_from

    @property
    def end_phy_offset(self) -> int:
        """Records at or below this offset are already indexed (-1 when there is no entry at all)."""
        return self._end_phy

    def _compute_end_phy(self) -> int:
        for f in reversed(self.files):
            if f.index_count > 1:
                return int(f.end_phy_offset)
        return -1

    def _writable(self) -> IndexFile:
        if self.files and not self.files[-1].is_full():
            return self.files[-1]
        prev = self.files[-1] if self.files else None
        if prev is not None:
            prev.flush()
            self.flushed_timestamp = max(self.flushed_timestamp, int(prev.end_timestamp))
        ms = self.clock.now_ms()
        path = self.directory / index_file_name(ms)
        while path.exists() or (self.files and path.name <= self.files[-1].path.name):
            ms += 1
            path = self.directory / index_file_name(ms)
        f = IndexFile(path, self.hash_slots, self.max_entries)
        if prev is not None:  # a new file continues where the full one stopped (as RocketMQ does)
            f.begin_phy_offset, f.begin_timestamp = prev.end_phy_offset, prev.end_timestamp
        self.files.append(f)
        fsync_dir(self.directory)
        return f

    def build(
        self, topic: str, properties: dict[str, str], phy_offset: int, store_ts: int, sys_flag: int
    ) -> None:
        if sys_flag & 0xC == 0xC:
            return  # rollback: never visible
        uniq = properties.get("UNIQ_KEY")
        raw_keys = properties.get("KEYS")
        if not uniq and not raw_keys:
            return
        with self.lock:
            if phy_offset <= self._end_phy:
                return
            f = self.files[-1] if self.files and not self.files[-1].is_full() else self._writable()
            prefix = self._prefix_hashes.get(topic)
            if prefix is None:
                prefix = self._prefix_hashes[topic] = java_string_hash(topic + "#")
            if uniq:
                f = self._put(f, index_key_hash(_hash_concat(prefix, uniq)), phy_offset, store_ts)
            if raw_keys:
                for key in raw_keys.split(KEY_SEPARATOR):
                    if key:
                        f = self._put(f, index_key_hash(_hash_concat(prefix, key)), phy_offset, store_ts)
            self._end_phy = phy_offset

    def _put(self, f: IndexFile, key_hash: int, phy_offset: int, store_ts: int) -> IndexFile:
        if not f.put_key(key_hash, phy_offset, store_ts):
            f = self._writable()
            f.put_key(key_hash, phy_offset, store_ts)
        return f

    def query(self, topic: str, key: str, max_num: int, begin: int, end: int) -> list[int]:
        """Commit-log offsets of entries for ``topic#key`` stored in [begin, end], newest first (may hold
        hash collisions: the caller checks the records)."""
        h = index_key_hash(java_string_hash(f"{topic}#{key}"))
        out: list[int] = []
        with self.lock:
            for f in reversed(self.files):
                if len(out) >= max_num:
                    break
                if f.overlaps(begin, end):
                    f.select(h, max_num, begin, end, out)
        return out

    def last_update(self) -> tuple[int, int]:
        with self.lock:
            for f in reversed(self.files):
                if f.index_count > 1:
                    return f.end_timestamp, f.end_phy_offset
        return 0, 0

    def delete_below(self, min_phys: int) -> int:
        """Delete files whose every entry points below ``min_phys`` (never the newest)."""
        deleted = 0
        with self.lock:
            while len(self.files) > 1 and self.files[0].end_phy_offset < min_phys:
                f = self.files.pop(0)
                f.close()
                f.destroy()
                deleted += 1
        return deleted

    def delete_all(self) -> None:
        with self.lock:
            for f in self.files:
                f.close()
                f.destroy()
            self.files = []
            self._end_phy = -1

    def flush(self) -> int:
        """Flush the header and entries of the newest file; returns its end timestamp (for the checkpoint)."""
        with self.lock:
            if not self.files:
                return 0
            f = self.files[-1]
            f.write_header()
            ts = int(f.end_timestamp)
        f.sync()  # outside the lock: the dispatcher keeps indexing while the disk works
        self.flushed_timestamp = max(self.flushed_timestamp, ts)
        return ts

    def close(self) -> None:
        with self.lock:
            for f in self.files:
                f.write_header()
                f.close()
