"""The commit log: every message of every topic appended to one sequence of mapped segments — the only
source of truth (consume queues and index are rebuilt from it).

The append path is the hot path. :meth:`CommitLog.prepare` validates and encodes the *whole* record outside
the lock (one ``HEADER.pack`` and one ``bytes.join``), leaving the three position-dependent fields zero;
under the lock :meth:`CommitLog._write` copies it into the mapped segment with one slice assignment and
patches QUEUEOFFSET + PHYSICALOFFSET (bytes 20..35, ``POSITION``) and STORETIMESTAMP (56..63) in place.
It also assigns queue offsets: the per topic-queue counter lives here (RocketMQ's
``CommitLog.topicQueueTable``) so that offsets follow commit order exactly. Half (prepared) and rollback
transaction records take queue offset 0 and do not advance it.

Each append also leaves a :data:`DispatchHint` in :attr:`CommitLog.dispatch_hints` — what the dispatcher
would otherwise re-read and re-parse from the mapped bytes (offsets, topic, TAGS, raw properties). The
dispatcher uses a hint only when it starts exactly where the dispatcher stands; anything else (recovery,
a gap, hints dropped because the dispatcher lags far behind) is dispatched from the log bytes as before.
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from broker_sim.clock import Clock
from broker_sim.store.errors import MessageIllegalError, PropertiesSizeExceededError
from broker_sim.store.mapped_file import MappedFile
from broker_sim.store.mapped_file_queue import MappedFileQueue
from broker_sim.store.message_record import (
    BLANK,
    BLANK_MAGIC,
    END_FILE_MIN_BLANK,
    FIXED_SIZE,
    HEADER,
    I16,
    I64,
    MESSAGE_MAGIC,
    PROPERTIES_MAX_LEN,
    MessageInner,
    check_topic,
    encode_properties,
    host_bytes,
)
from broker_sim.store.results import AppendMessageResult, AppendMessageStatus

_PUT_OK = AppendMessageStatus.PUT_OK
SIZE_MAGIC = BLANK  # the same ">ii" shape reads (TOTALSIZE, MAGICCODE) of a record
POSITION = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET at record byte 20
STORE_TS_AT = 56
#: TAGS value of a hint whose properties do not survive a decode unchanged (a name or value holding
#: \x01/\x02): the dispatcher then decodes ``props_b`` exactly as it would from disk.
TAGS_UNKNOWN = "\x00unknown"
MAX_HINTS = 200_000  # beyond this backlog new appends leave no hint (the log bytes still dispatch them)

# (record with QUEUEOFFSET/PHYSICALOFFSET/STORETIMESTAMP zero, (topic, queue id), counts in queue,
#  store host, TAGS value or None or TAGS_UNKNOWN, raw properties, sys flag, prepared-tx offset)
Prepared = tuple[bytes, tuple[str, int], bool, bytes, str | None, bytes, int, int]
# (log end before the append, physical offset, size, topic, queue id, queue offset, store timestamp,
#  sys flag, prepared-tx offset, TAGS value (see TAGS_UNKNOWN), raw properties)
DispatchHint = tuple[int, int, int, str, int, int, int, int, int, str | None, bytes]


class CommitLog:
    def __init__(
        self, directory: Path, file_size: int, max_message_size: int, store_host: bytes, clock: Clock
    ) -> None:
        self.mfq = MappedFileQueue(directory, file_size)
        self.file_size = file_size
        self.max_message_size = max_message_size
        self.store_host = store_host
        self.clock = clock
        self.lock = threading.Lock()
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self._topic_fields: dict[str, bytes] = {}
        # (end offset, store timestamp) of the newest record: the flusher turns it into the checkpoint
        self.last_append: tuple[int, int] = (0, 0)
        self.dispatch_hints: deque[DispatchHint] = deque()

    # ------------------------------------------------------------------------------------------ append
    def prepare(self, msg: MessageInner) -> Prepared:
        """Validate and encode everything that does not depend on the append position (outside the lock)."""
        topic_field = self._topic_fields.get(msg.topic)
        if topic_field is None:
            raw = check_topic(msg.topic)
            topic_field = bytes((len(raw),)) + raw
            self._topic_fields[msg.topic] = topic_field
        props = msg.properties
        if props:
            props_b = encode_properties(props)
            plen = len(props_b)
            if plen > PROPERTIES_MAX_LEN:
                raise PropertiesSizeExceededError(f"properties are {plen} bytes, more than 32767")
            n = len(props)
            clean = props_b.count(1) == n and props_b.count(2) == n - 1
            tags = props.get("TAGS") if clean else TAGS_UNKNOWN
        else:
            props_b, plen, tags = b"", 0, None
        body = msg.body
        blen = len(body)
        if blen > self.max_message_size:
            raise MessageIllegalError(
                f"body is {blen} bytes, more than max_message_size {self.max_message_size}"
            )
        size = FIXED_SIZE - 1 + blen + len(topic_field) + plen
        if size + END_FILE_MIN_BLANK > self.file_size:
            raise MessageIllegalError(f"a {size}-byte record cannot fit a {self.file_size}-byte segment")
        qid = msg.queue_id
        if not 0 <= qid <= 0x7FFFFFFF:
            raise MessageIllegalError(f"queue id {qid} out of range")
        sys_flag = msg.sys_flag
        if sys_flag & 0x30:
            raise MessageIllegalError("IPv6 hosts are not supported (sysFlag 0x10/0x20)")
        tran = sys_flag & 0xC
        shost = self.store_host if msg.store_host is None else host_bytes(msg.store_host)
        prepared = msg.prepared_transaction_offset
        try:
            header = HEADER.pack(
                size, MESSAGE_MAGIC, zlib.crc32(body) & 0x7FFFFFFF, qid, msg.flag, 0, 0, sys_flag,
                msg.born_timestamp, host_bytes(msg.born_host), 0, shost, msg.reconsume_times, prepared, blen,
            )  # fmt: skip
        except struct.error as exc:
            raise MessageIllegalError(f"a header field is out of range: {exc}") from exc
        record = b"".join((header, body, topic_field, I16.pack(plen), props_b))
        return record, (msg.topic, qid), tran != 0x4 and tran != 0xC, shost, tags, props_b, sys_flag, prepared

    def _write(self, p: Prepared, now: int) -> tuple[int, int]:
        """Append one prepared record (lock held); returns (physical offset, queue offset)."""
        record, key, counted = p[0], p[1], p[2]
        size = len(record)
        table = self.topic_queue_table
        qoff = table.get(key, 0) if counted else 0
        files = self.mfq.files
        mf: MappedFile = files[-1] if files else self.mfq.create(0)
        pos = mf.wrote
        prev_end = mf.file_from_offset + pos
        if size + END_FILE_MIN_BLANK > self.file_size - pos:
            # BLANK marker: int32 remaining + int32 magic, then the record goes to a fresh segment
            BLANK.pack_into(mf.mm, pos, self.file_size - pos, BLANK_MAGIC)
            mf.wrote = self.file_size
            mf = self.mfq.create(mf.end_offset)
            pos = 0
        phys = mf.file_from_offset + pos
        mm = mf.mm
        mm[pos : pos + size] = record
        POSITION.pack_into(mm, pos + 20, qoff, phys)
        I64.pack_into(mm, pos + STORE_TS_AT, now)
        mf.wrote = pos + size
        if counted:
            table[key] = qoff + 1
        hints = self.dispatch_hints
        if len(hints) < MAX_HINTS:
            hints.append((prev_end, phys, size, key[0], key[1], qoff, now, p[6], p[7], p[4], p[5]))
        return phys, qoff

    def append(self, msg: MessageInner) -> AppendMessageResult:
        """Append one message; raises MessageIllegalError/PropertiesSizeExceededError for bad input."""
        p = self.prepare(msg)
        with self.lock:
            now = self.clock.now_ms()
            phys, qoff = self._write(p, now)
            size = len(p[0])
            self.last_append = (phys + size, now)
        return AppendMessageResult(_PUT_OK, phys, size, qoff, now, 1, p[3])

    def append_batch(self, msgs: Sequence[MessageInner]) -> AppendMessageResult:
        """Append several messages contiguously under one lock (one flush wait covers them all)."""
        prepared = [self.prepare(m) for m in msgs]
        offsets: list[int] = []
        with self.lock:
            now = self.clock.now_ms()
            first_qoff = 0
            total = 0
            for i, p in enumerate(prepared):
                phys, qoff = self._write(p, now)
                if i == 0:
                    first_qoff = qoff
                offsets.append(phys)
                total += len(p[0])
            self.last_append = (offsets[-1] + len(prepared[-1][0]), now)
        return AppendMessageResult(
            _PUT_OK, offsets[0], total, first_qoff, now, len(prepared), prepared[0][3], tuple(offsets)
        )

    # ------------------------------------------------------------------------------------------ read
    @property
    def max_offset(self) -> int:
        return self.mfq.max_offset

    @property
    def min_offset(self) -> int:
        return self.mfq.min_offset

    def record_at(self, phys: int, size: int = 0) -> bytes | None:
        """The raw record at ``phys`` (None if it is gone, not yet written, or not a record)."""
        mf = self.mfq.find(phys)
        if mf is None:
            return None
        pos = phys - mf.file_from_offset
        if pos + FIXED_SIZE > mf.wrote:
            return None
        mm = mf.mm
        try:
            if size <= 0:
                size, magic = SIZE_MAGIC.unpack_from(mm, pos)
                if magic != MESSAGE_MAGIC:
                    return None
            if pos + size > mf.wrote:
                return None
            return mm[pos : pos + size]
        except ValueError:
            return None  # the segment was deleted (and its mapping closed) by expiry meanwhile

    def next_segment_offset(self, phys: int) -> int:
        """Where the segment after the one holding ``phys`` starts (skips a BLANK marker)."""
        return phys + self.file_size - phys % self.file_size

    def flush(self) -> int:
        return self.mfq.flush()

    # ------------------------------------------------------------------------------------------ replication
    def read_for_replica(self, offset: int, max_bytes: int) -> bytes:
        """Whole records (and a segment's closing BLANK marker) from ``offset``, at most ``max_bytes`` unless
        the first record alone is larger; empty when nothing is written there yet. The master's HA
        connection sends these; stopping at record boundaries means a slave never holds half a record."""
        mf = self.mfq.find(offset)
        if mf is None:
            return b""
        pos = start = offset - mf.file_from_offset
        mm = mf.mm
        try:
            while pos + 8 <= mf.wrote:
                size, magic = SIZE_MAGIC.unpack_from(mm, pos)
                if magic == BLANK_MAGIC:
                    pos = self.file_size
                    break
                if magic != MESSAGE_MAGIC or size <= 0 or pos + size > mf.wrote:
                    break
                if pos > start and pos + size - start > max_bytes:
                    break
                pos += size
            return bytes(mm[start:pos])
        except ValueError:
            return b""  # the segment was deleted (and its mapping closed) by expiry meanwhile

    def append_replica(self, offset: int, data: bytes) -> None:
        """Write bytes a master sent, at ``offset`` (the end of this log, or anywhere when it is empty)."""
        with self.lock:
            end = self.mfq.max_offset
            if self.mfq.files and offset != end:
                raise MessageIllegalError(f"replica data at {offset} does not continue this log at {end}")
            mf = self.mfq.file_for_write(offset)
            pos = offset - mf.file_from_offset
            if pos + len(data) > self.file_size:
                raise MessageIllegalError(f"replica data at {offset} crosses a segment end")
            mf.mm[pos : pos + len(data)] = data
            mf.wrote = pos + len(data)
            self.last_append = (offset + len(data), self.clock.now_ms())
