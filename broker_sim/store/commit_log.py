"""The commit log: every message of every topic appended to one sequence of mapped segments — the only
source of truth (consume queues and index are rebuilt from it).

The append path is the hot path, so it validates and encodes outside the lock, then packs the fixed header
with one precompiled ``Struct.pack_into`` straight into the mapped segment and copies body, topic and
properties with slice assignments (no intermediate record object). It also assigns queue offsets: the
per topic-queue counter lives here (RocketMQ's ``CommitLog.topicQueueTable``) so that offsets follow commit
order exactly. Half (prepared) and rollback transaction records take queue offset 0 and do not advance it.
"""

from __future__ import annotations

import threading
import zlib
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

# (size, crc, qid, flag, sys_flag, born_ts, born_host, store_host, reconsume, prepared, body,
#  topic_field, props_b, queue_key, counts_in_queue)
Prepared = tuple[
    int, int, int, int, int, int, bytes, bytes, int, int, bytes, bytes, bytes, tuple[str, int], bool
]


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

    # ------------------------------------------------------------------------------------------ append
    def prepare(self, msg: MessageInner) -> Prepared:
        """Validate and encode everything that does not depend on the append position (outside the lock)."""
        topic_field = self._topic_fields.get(msg.topic)
        if topic_field is None:
            raw = check_topic(msg.topic)
            topic_field = bytes((len(raw),)) + raw
            self._topic_fields[msg.topic] = topic_field
        props = msg.properties
        props_b = encode_properties(props) if props else b""
        if len(props_b) > PROPERTIES_MAX_LEN:
            raise PropertiesSizeExceededError(f"properties are {len(props_b)} bytes, more than 32767")
        body = msg.body
        blen = len(body)
        if blen > self.max_message_size:
            raise MessageIllegalError(
                f"body is {blen} bytes, more than max_message_size {self.max_message_size}"
            )
        size = FIXED_SIZE - 1 + blen + len(topic_field) + len(props_b)
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
        return (
            size, zlib.crc32(body) & 0x7FFFFFFF, qid, msg.flag, sys_flag, msg.born_timestamp,
            host_bytes(msg.born_host), shost, msg.reconsume_times, msg.prepared_transaction_offset,
            body, topic_field, props_b, (msg.topic, qid), tran != 0x4 and tran != 0xC,
        )  # fmt: skip

    def _write(self, p: Prepared, now: int) -> tuple[int, int]:
        """Append one prepared record (lock held); returns (physical offset, queue offset)."""
        (size, crc, qid, flag, sys_flag, born_ts, born, shost, reconsume, prepared, body, topic_field,
         props_b, key, counted) = p  # fmt: skip
        table = self.topic_queue_table
        qoff = table.get(key, 0) if counted else 0
        files = self.mfq.files
        mf: MappedFile = files[-1] if files else self.mfq.create(0)
        pos = mf.wrote
        if size + END_FILE_MIN_BLANK > self.file_size - pos:
            # BLANK marker: int32 remaining + int32 magic, then the record goes to a fresh segment
            BLANK.pack_into(mf.mm, pos, self.file_size - pos, BLANK_MAGIC)
            mf.wrote = self.file_size
            mf = self.mfq.create(mf.end_offset)
            pos = 0
        phys = mf.file_from_offset + pos
        mm = mf.mm
        blen = len(body)
        HEADER.pack_into(
            mm, pos, size, MESSAGE_MAGIC, crc, qid, flag, qoff, phys, sys_flag, born_ts, born, now, shost,
            reconsume, prepared, blen,
        )  # fmt: skip
        q = pos + 88
        mm[q : q + blen] = body
        q += blen
        tl = len(topic_field)
        mm[q : q + tl] = topic_field
        q += tl
        plen = len(props_b)
        I16.pack_into(mm, q, plen)
        if plen:
            mm[q + 2 : q + 2 + plen] = props_b
        mf.wrote = pos + size
        if counted:
            table[key] = qoff + 1
        return phys, qoff

    def append(self, msg: MessageInner) -> AppendMessageResult:
        """Append one message; raises MessageIllegalError/PropertiesSizeExceededError for bad input."""
        p = self.prepare(msg)
        with self.lock:
            now = self.clock.now_ms()
            phys, qoff = self._write(p, now)
            self.last_append = (phys + p[0], now)
        return AppendMessageResult(_PUT_OK, phys, p[0], qoff, now, 1, p[7])

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
                total += p[0]
            self.last_append = (offsets[-1] + prepared[-1][0], now)
        return AppendMessageResult(
            _PUT_OK, offsets[0], total, first_qoff, now, len(prepared), prepared[0][7], tuple(offsets)
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
