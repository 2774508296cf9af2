"""One index file: lookup of commit-log offsets by key (``topic#key``) within a time range.

Layout (all big-endian)::

    header, 40 B:  beginTimestamp i64 | endTimestamp i64 | beginPhyOffset i64 | endPhyOffset i64
                   | hashSlotCount i32 | indexCount i32 (starts at 1: entry number 0 means "none")
    slots:         hashSlots × i32     newest entry number whose key hashes to the slot
    entries:       maxEntries × 20 B   keyHash i32 | phyOffset i64 | timeDiff i32 (s since begin) | prev i32

Entry *n* lives at ``40 + 4·hashSlots + 20·n``; ``prev`` chains entries of one slot newest→oldest. keyHash is
``abs(String.hashCode(key))`` (0 when that overflows), slot = keyHash mod hashSlots. The file is named by its
creation time ``yyyyMMddHHmmssSSS`` and is full when ``indexCount >= maxEntries``.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

from broker_sim.store.mapped_file import map_file

HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")
SLOT = struct.Struct(">i")
HEADER_SIZE = 40
ENTRY_SIZE = 20
assert HEADER.size == HEADER_SIZE and ENTRY.size == ENTRY_SIZE


def index_key_hash(java_hash: int) -> int:
    """RocketMQ's ``indexKeyHashMethod``: abs of the Java hash, with abs(MIN_VALUE) mapped to 0."""
    h = abs(java_hash)
    return 0 if h > 0x7FFFFFFF else h


class IndexFile:
    """One mapped index file (named by time, so not a :class:`MappedFile`)."""

    def __init__(self, path: Path, hash_slots: int, max_entries: int) -> None:
        self.path = path
        self.hash_slots = hash_slots
        self.max_entries = max_entries
        self.file_size = HEADER_SIZE + hash_slots * 4 + max_entries * ENTRY_SIZE
        self.mm, self._fd = map_file(path, self.file_size)
        # slots are hashed and lookups follow chains: no readahead (nor the large folios it would make, each
        # rewritten whole by the periodic flush; see mapped_file.py)
        self.mm.madvise(mmap.MADV_RANDOM)
        (self.begin_timestamp, self.end_timestamp, self.begin_phy_offset, self.end_phy_offset,
         self.hash_slot_count, self.index_count) = HEADER.unpack_from(self.mm, 0)  # fmt: skip
        if self.index_count <= 0:
            self.index_count = 1
        self._entries_base = HEADER_SIZE + hash_slots * 4

    def is_full(self) -> bool:
        return bool(self.index_count >= self.max_entries)

    def put_key(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        """Add one entry; False when the file is full (the caller rolls to a new file)."""
        if self.index_count >= self.max_entries:
            return False
        mm = self.mm
        slot_pos = HEADER_SIZE + (key_hash % self.hash_slots) * 4
        (prev,) = SLOT.unpack_from(mm, slot_pos)
        if prev <= 0 or prev > self.index_count:
            prev = 0
            self.hash_slot_count += 1
        if self.index_count <= 1:
            self.begin_phy_offset = phy_offset
            self.begin_timestamp = store_timestamp
        diff = (store_timestamp - self.begin_timestamp) // 1000
        diff = 0 if diff < 0 else min(diff, 0x7FFFFFFF)
        n = self.index_count
        ENTRY.pack_into(mm, self._entries_base + n * ENTRY_SIZE, key_hash, phy_offset, diff, prev)
        SLOT.pack_into(mm, slot_pos, n)
        self.index_count = n + 1
        self.end_phy_offset = phy_offset
        self.end_timestamp = store_timestamp
        return True

    def write_header(self) -> None:
        HEADER.pack_into(
            self.mm, 0, self.begin_timestamp, self.end_timestamp, self.begin_phy_offset, self.end_phy_offset,
            self.hash_slot_count, self.index_count,
        )  # fmt: skip

    def overlaps(self, begin: int, end: int) -> bool:
        return bool(self.index_count > 1 and self.begin_timestamp <= end and self.end_timestamp >= begin)

    def select(self, key_hash: int, max_num: int, begin: int, end: int, out: list[int]) -> None:
        """Append to ``out`` the offsets of entries with ``key_hash`` stored within [begin, end], newest
        first, until ``out`` holds ``max_num``."""
        mm = self.mm
        (n,) = SLOT.unpack_from(mm, HEADER_SIZE + (key_hash % self.hash_slots) * 4)
        seen = 0
        while 0 < n < self.index_count and len(out) < max_num and seen < self.max_entries:
            h, phy, diff, prev = ENTRY.unpack_from(mm, self._entries_base + n * ENTRY_SIZE)
            ts = self.begin_timestamp + diff * 1000
            if h == key_hash and begin <= ts <= end:
                out.append(phy)
            if ts < begin or prev >= n:
                break  # older entries only get older; a forward link would be corruption
            n = prev
            seen += 1

    def flush(self) -> None:
        self.write_header()
        self.sync()

    def sync(self) -> None:
        if self._fd >= 0:
            os.fdatasync(self._fd)

    def close(self) -> None:
        if not self.mm.closed:
            self.mm.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def destroy(self) -> None:
        self.path.unlink(missing_ok=True)
