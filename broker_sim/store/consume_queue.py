"""A consume queue: the per topic/queue list of 20-byte units pointing into the commit log.

Unit layout (``UNIT``), at byte ``queueOffset × 20`` of the queue's byte space::

    0 commitLogOffset i64 | 8 size i32 | 12 tagsCode i64   (tag hash, or delivery time for the delay topic)

Files hold ``consume_queue_units`` units each (300,000 by default) and are named by their start *byte*
offset. A unit with ``size <= 0`` is empty (files are created zero-filled), which is how recovery finds the
end of a queue.
"""

from __future__ import annotations

import logging
import mmap
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

from broker_sim.store.config import CQ_UNIT_SIZE
from broker_sim.store.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)
UNIT = struct.Struct(">qiq")
_SIZE = struct.Struct(">i")
assert UNIT.size == CQ_UNIT_SIZE


class ConsumeQueue:
    def __init__(self, root: Path, topic: str, queue_id: int, units_per_file: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.mfq = MappedFileQueue(root / topic / str(queue_id), units_per_file * CQ_UNIT_SIZE)
        self.min_logic_offset = 0  # bytes; units below it point at deleted commit log
        self.max_phys_end = 0  # end (offset + size) of the furthest commit-log record indexed here
        self.rejected_units = 0

    # ------------------------------------------------------------------------------------- recovery
    def load_and_recover(self) -> None:
        """Map the files and find the end: the first empty unit of the last non-empty file."""
        self.mfq.load()
        files = self.mfq.files
        if not files:
            return
        # a queue may start inside its first file (rebuilt after the log head expired): skip leading blanks
        first_unit = self._first_unit(files[0].mm)
        self.min_logic_offset = files[0].file_from_offset + first_unit * CQ_UNIT_SIZE
        # empty trailing files (created at a roll, never written) are dropped
        while files:
            last = files[-1]
            n = self._count_units(last.mm, first_unit if len(files) == 1 else 0)
            if n == 0 and len(files) > 1:
                last.destroy()
                files.pop()
                continue
            last.wrote = last.flushed = n * CQ_UNIT_SIZE
            break
        self.mfq.start_appending()
        end = self.mfq.max_offset
        if end > self.min_logic_offset:
            phys, size, _ = self.unit_at_byte(end - CQ_UNIT_SIZE)
            self.max_phys_end = phys + size
        else:
            self.min_logic_offset = end

    @staticmethod
    def _first_unit(buf: mmap.mmap) -> int:
        total = len(buf) // CQ_UNIT_SIZE
        n = 0
        while n < total and _SIZE.unpack_from(buf, n * CQ_UNIT_SIZE + 8)[0] <= 0:
            n += 1
        return 0 if n == total else n

    @staticmethod
    def _count_units(buf: mmap.mmap, start: int = 0) -> int:
        """Index just past the last unit of the run starting at ``start`` (a scan, not a binary search:
        after a torn write the zeros are not guaranteed to be a clean suffix)."""
        n = start
        total = len(buf) // CQ_UNIT_SIZE
        while n < total and _SIZE.unpack_from(buf, n * CQ_UNIT_SIZE + 8)[0] > 0:
            n += 1
        return 0 if n == start else n

    def truncate_dirty(self, phys_end: int) -> None:
        """Drop units pointing at or past ``phys_end`` (commit-log data that recovery cut)."""
        end = self.mfq.max_offset
        start = self.min_logic_offset
        new_end = end
        while new_end > start:
            phys, size, _ = self.unit_at_byte(new_end - CQ_UNIT_SIZE)
            if phys + size <= phys_end and size > 0:
                break
            new_end -= CQ_UNIT_SIZE
        if new_end != end:
            self.mfq.truncate(new_end)
            if not self.mfq.files:
                self.min_logic_offset = new_end
        self.max_phys_end = 0
        if new_end > start:
            phys, size, _ = self.unit_at_byte(new_end - CQ_UNIT_SIZE)
            self.max_phys_end = phys + size

    # ------------------------------------------------------------------------------------- write
    def put(self, queue_offset: int, phys: int, size: int, tags_code: int) -> None:
        """Write the unit for ``queue_offset`` (idempotent: re-dispatching rewrites the same bytes)."""
        pos = queue_offset * CQ_UNIT_SIZE
        mfq = self.mfq
        if not mfq.files:
            if pos < 0:
                return self._reject(queue_offset, phys)
            mf = mfq.file_for_write(pos)
            self.min_logic_offset = pos
        else:
            mf = mfq.files[-1]
            if not mf.file_from_offset <= pos < mf.file_from_offset + mf.file_size:
                if not self.min_logic_offset <= pos <= mfq.max_offset:
                    return self._reject(queue_offset, phys)
                mf = mfq.file_for_write(pos)
            elif pos > mf.file_from_offset + mf.wrote:
                return self._reject(queue_offset, phys)
        local = pos - mf.file_from_offset
        UNIT.pack_into(mf.mm, local, phys, size, tags_code)
        if local + CQ_UNIT_SIZE > mf.wrote:
            mf.wrote = local + CQ_UNIT_SIZE
        end = phys + size
        if end > self.max_phys_end:
            self.max_phys_end = end

    def put_packed(self, first_offset: int, units: bytes) -> None:
        """Write packed units (``UNIT`` × n) for consecutive queue offsets from ``first_offset``.

        Where the run continues the queue inside its last file it is one slice assignment; anything else
        (the queue's first unit, a re-dispatch, a file boundary) goes through :meth:`put` with its checks,
        one unit at a time until the rest can again be copied whole."""
        done = 0
        total = len(units)
        while done < total:
            files = self.mfq.files
            mf = files[-1] if files else None
            local = (first_offset * CQ_UNIT_SIZE + done) - mf.file_from_offset if mf is not None else -1
            if mf is not None and local == mf.wrote and local < mf.file_size:
                n = min(total - done, mf.file_size - local)
                mf.mm[local : local + n] = units[done : done + n]
                mf.wrote = local + n
                phys, size, _ = UNIT.unpack_from(units, done + n - CQ_UNIT_SIZE)
                if phys + size > self.max_phys_end:
                    self.max_phys_end = phys + size
                done += n
            else:
                self.put(first_offset + done // CQ_UNIT_SIZE, *UNIT.unpack_from(units, done))
                done += CQ_UNIT_SIZE

    def _reject(self, queue_offset: int, phys: int) -> None:
        """A record whose QUEUEOFFSET would leave a gap (or go below the queue): QUEUEOFFSET is not covered
        by the body CRC, so a damaged header could otherwise make us create files up to 2**63."""
        self.rejected_units += 1
        log.error(
            "consume queue %s/%d: record at %d claims queue offset %d but the queue ends at %d: not indexed",
            self.topic, self.queue_id, phys, queue_offset, self.max_offset,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------- read
    @property
    def max_offset(self) -> int:
        """Next queue offset to be written (RocketMQ's getMaxOffsetInQueue)."""
        return self.mfq.max_offset // CQ_UNIT_SIZE

    @property
    def min_offset(self) -> int:
        return self.min_logic_offset // CQ_UNIT_SIZE

    def unit_at_byte(self, pos: int) -> tuple[int, int, int]:
        mf = self.mfq.find(pos)
        if mf is None:
            return 0, 0, 0
        phys, size, tags = UNIT.unpack_from(mf.mm, pos - mf.file_from_offset)
        return phys, size, tags

    def get(self, queue_offset: int) -> tuple[int, int, int] | None:
        """(commitLogOffset, size, tagsCode) of one unit, None outside [min, max)."""
        if not self.min_offset <= queue_offset < self.max_offset:
            return None
        mf = self.mfq.find(queue_offset * CQ_UNIT_SIZE)
        if mf is None:
            return None
        phys, size, tags = UNIT.unpack_from(mf.mm, queue_offset * CQ_UNIT_SIZE - mf.file_from_offset)
        return phys, size, tags

    def iter_units(self, queue_offset: int, limit: int) -> Iterator[tuple[int, int, int]]:
        """Up to ``limit`` units from ``queue_offset`` within *one* file (as RocketMQ's getIndexBuffer)."""
        pos = queue_offset * CQ_UNIT_SIZE
        mf = self.mfq.find(pos)
        if mf is None:
            return iter(())
        local = pos - mf.file_from_offset
        end = min(mf.wrote, local + limit * CQ_UNIT_SIZE)
        # one slice of N×20 bytes, unpacked lazily in C (not a generator: get_message's loop is hot)
        return UNIT.iter_unpack(mf.mm[local:end] if end > local else b"")

    def offset_by_time(self, timestamp: int, store_time_of: Callable[[int, int], int | None]) -> int:
        """Smallest queue offset whose message was stored at or after ``timestamp`` (binary search over the
        commit-log store times); ``max`` if every message is older."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self.get(mid)
            ts = store_time_of(unit[0], unit[1]) if unit else None
            if ts is None or ts < timestamp:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # ------------------------------------------------------------------------------------- expiry
    def delete_expired(self, min_phys: int) -> int:
        """Delete whole files whose last unit points below ``min_phys``; then move the min offset past
        units that still do. Returns the number of files deleted."""
        deleted = 0
        files = self.mfq.files
        while len(files) > 1:
            first = files[0]
            last_unit = UNIT.unpack_from(first.mm, first.file_size - CQ_UNIT_SIZE)
            if last_unit[0] + last_unit[1] > min_phys:
                break
            self.mfq.delete_first(1)
            files = self.mfq.files
            deleted += 1
        if files:
            pos = max(self.min_logic_offset, files[0].file_from_offset)
            end = self.mfq.max_offset
            while pos < end:
                phys = self.unit_at_byte(pos)[0]
                if phys >= min_phys:
                    break
                pos += CQ_UNIT_SIZE
            self.min_logic_offset = pos
        return deleted

    def flush(self) -> int:
        return self.mfq.flush()

    def close(self) -> None:
        self.mfq.close()
