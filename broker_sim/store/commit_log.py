"""The commit log: every message of every topic appended to one sequence of mapped segments — the only
source of truth (consume queues and index are rebuilt from it).

The append path is the hot path, and lives in :mod:`broker_sim.store.codec` (compiled, with a pure-Python
twin): ``prepare`` validates and encodes the *whole* record outside the lock, leaving QUEUEOFFSET,
PHYSICALOFFSET and STORETIMESTAMP zero; under the lock ``place`` copies it into the mapped segment, patches
those fields in place and assigns the queue offset: the per topic-queue counter lives here (RocketMQ's
``CommitLog.topicQueueTable``) so that offsets follow commit order exactly. Half (prepared) and rollback
transaction records take queue offset 0 and do not advance it.

Each append also leaves a :data:`DispatchHint` in :attr:`CommitLog.dispatch_hints` — what the dispatcher
would otherwise re-read and re-parse from the mapped bytes (offsets, topic, TAGS, raw properties). The
dispatcher uses a hint only when it starts exactly where the dispatcher stands; anything else (recovery,
a gap, hints dropped because the dispatcher lags far behind) is dispatched from the log bytes as before.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol

from broker_sim.clock import Clock, SystemClock
from broker_sim.store import codec
from broker_sim.store.codec import TAGS_UNKNOWN, DispatchHint, Prepared
from broker_sim.store.errors import MessageIllegalError
from broker_sim.store.mapped_file import MappedFile
from broker_sim.store.mapped_file_queue import MappedFileQueue
from broker_sim.store.message_record import (
    BLANK,
    BLANK_MAGIC,
    END_FILE_MIN_BLANK,
    FIXED_SIZE,
    MESSAGE_MAGIC,
    MessageInner,
)
from broker_sim.store.results import AppendMessageResult, AppendMessageStatus, PutMessageResult

__all__ = ["MAX_HINTS", "NO_PREFAULT", "TAGS_UNKNOWN", "CommitLog", "DispatchHint", "Prepared"]

_PUT_OK = AppendMessageStatus.PUT_OK
SIZE_MAGIC = BLANK  # the same ">ii" shape reads (TOTALSIZE, MAGICCODE) of a record
MAX_HINTS = 200_000  # beyond this backlog new appends leave no hint (the log bytes still dispatch them)
NO_PREFAULT = 2**63 - 1
PlainPut = Callable[[MessageInner], PutMessageResult]


def _nothing() -> None:
    return None


class LockLike(Protocol):
    """What the commit-log lock offers: threading.Lock's interface (and the compiled ``AppendLock``'s)."""

    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...
    def release(self) -> None: ...
    def locked(self) -> bool: ...
    def __enter__(self) -> bool: ...
    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None, /
    ) -> None: ...


def compiled_lock() -> LockLike:
    """A new compiled ``AppendLock`` (requires the compiled codec)."""
    lock: LockLike = codec.compiled.AppendLock()
    return lock


class CommitLog:
    # slots: the compiled append reads several of them per put, in place (``codec.register_slots``)
    __slots__ = (
        "_now", "_place", "_prepare", "clock", "codec", "dispatch_hints", "file_size", "hint_append", "impl",
        "last_append", "lock", "max_hints", "max_message_size", "mfq", "prefault_mark", "prefault_wake",
        "put_state", "store_host", "topic_fields", "topic_queue_table",
    )  # fmt: skip

    def __init__(
        self,
        directory: Path,
        file_size: int,
        max_message_size: int,
        store_host: bytes,
        clock: Clock,
        impl: str | None = None,
    ) -> None:
        self.mfq = MappedFileQueue(directory, file_size)
        self.file_size = file_size
        self.max_message_size = max_message_size
        self.store_host = store_host
        self.clock = clock
        self.impl = impl or codec.IMPL
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self.topic_fields: dict[str, bytes] = {}
        # (end offset, store timestamp) of the newest record: the flusher turns it into the checkpoint
        self.last_append: tuple[int, int] = (0, 0)
        self.dispatch_hints: deque[DispatchHint] = deque()
        #: ``dispatch_hints.append``, bound once (the compiled append calls it without a method lookup)
        self.hint_append: Callable[[DispatchHint], None] = self.dispatch_hints.append
        self.max_hints = MAX_HINTS
        # an append ending at or past this offset calls prefault_wake (see broker_sim.store.prefault)
        self.prefault_mark = NO_PREFAULT
        self.prefault_wake: Callable[[], None] = _nothing
        #: what the compiled ``put_plain`` needs (set by MessageStore when it uses it)
        self.put_state: tuple[object, ...] = ()
        #: "c" or "python" (``impl``): which twin of :mod:`broker_sim.store.codec` appends (tests pick both)
        self.codec = codec.implementation(self.impl)
        #: taken around every append; the compiled twin's lock has threading.Lock's interface and is taken by
        #: the compiled put without a Python call
        self.lock: LockLike = compiled_lock() if self.impl == "c" else threading.Lock()
        self._prepare, self._place = self.codec.prepare, self.codec.place
        self._now = self.codec.now_ms if type(clock) is SystemClock else clock.now_ms

    # ------------------------------------------------------------------------------------------ append
    def prepare(self, msg: MessageInner) -> Prepared:
        """Validate and encode everything that does not depend on the append position (outside the lock)."""
        return self._prepare(msg, self.store_host, self.topic_fields, self.max_message_size, self.file_size)

    def roll(self, size: int) -> MappedFile:
        """The segment a ``size``-byte record goes to: the last one, or — when the record does not fit it —
        a new one after a BLANK marker (int32 remaining + int32 magic) closing the full one."""
        files = self.mfq.files
        if not files:
            return self.mfq.create(0)
        mf = files[-1]
        pos = mf.wrote
        if size + END_FILE_MIN_BLANK > self.file_size - pos:
            BLANK.pack_into(mf.mm, pos, self.file_size - pos, BLANK_MAGIC)
            mf.wrote = self.file_size
            mf = self.mfq.create(mf.end_offset)
        return mf

    def plain_put(
        self,
        wake: threading.Event,
        gate: object,
        expiry: object,
        general: PlainPut,
        sync: tuple[object, float, Callable[[AppendMessageResult, bool], PutMessageResult]] | None = None,
    ) -> PlainPut | None:
        """The compiled one-call put (codec ``put_plain`` bound to this log) for a store whose puts only
        append and then set ``wake`` (ASYNC_FLUSH, asynchronous dispatch, no replication) or, with ``sync`` =
        (compiled flush gate, timeout in seconds, outcome), wait on that gate (SYNC_FLUSH) — if this log
        appends in C on the system clock; else None. It reads ``gate.running`` (and ``gate.crashed``) and
        ``expiry.disk_full`` and hands every put it does not take itself to ``general``."""
        if codec.compiled is None or self.impl != "c" or self._now is not self.codec.now_ms:
            return None
        flush_gate, timeout_s, outcome = sync or (None, 0.0, None)
        self.put_state = (
            self.store_host, self.topic_fields, self.max_message_size, self.file_size, self.lock, wake,
            gate, expiry, general, flush_gate, timeout_s, outcome, vars(wake),
        )  # fmt: skip
        put: PlainPut = codec.compiled.bind_put(self)
        return put

    def append(self, msg: MessageInner) -> AppendMessageResult:
        """Append one message; raises MessageIllegalError/PropertiesSizeExceededError for bad input."""
        p = self._prepare(msg, self.store_host, self.topic_fields, self.max_message_size, self.file_size)
        with self.lock:
            return self._place(self, p, self._now())

    def append_batch(self, msgs: Sequence[MessageInner]) -> AppendMessageResult:
        """Append several messages contiguously under one lock (one flush wait covers them all)."""
        prepared = [self.prepare(m) for m in msgs]
        with self.lock:
            now = self._now()
            results = [self._place(self, p, now) for p in prepared]
        first = results[0]
        total = sum(r.wrote_bytes for r in results)
        offsets = tuple(r.wrote_offset for r in results)
        return AppendMessageResult(
            _PUT_OK,
            first.wrote_offset,
            total,
            first.queue_offset,
            now,
            len(results),
            first.store_host,
            offsets,
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

    def flush(self, least_pages: int = 0) -> int:
        return self.mfq.flush(least_pages)

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


if codec.compiled is not None:
    codec.compiled.register_slots(CommitLog, "commit_log")
    codec.compiled.register_slots(MappedFileQueue, "file_queue")
