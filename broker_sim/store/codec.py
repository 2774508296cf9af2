"""The append hot path in two implementations with one behaviour: the compiled ``_codec`` extension (built by
``pip install``) and the pure-Python functions below, which are the specification and the fallback.

Why compiled: an append used to cost ≈ 7–9 µs of interpreted work (validate, encode properties, pack the
header, copy, patch offsets, leave a dispatch hint, build results) against ≈ 1 µs for the bare ``memcpy``
that bench a1 compares it with; the dispatcher spent another ≈ 1.3 µs per record grouping units. Each step
is a few bytecodes, so only moving the whole step into C removes it. Three functions cross the boundary:

* :func:`py_prepare` — validate and encode one record outside the lock (``CommitLog.prepare``'s old body);
  the layout is :data:`broker_sim.store.message_record.HEADER`'s (drawn in that module). QUEUEOFFSET,
  PHYSICALOFFSET and STORETIMESTAMP stay zero until :func:`py_place`.
* :func:`py_place` — under the commit-log lock: copy the record into the last segment (rolling it with a
  BLANK marker when it does not fit), patch the three position fields, advance the queue-offset counter,
  leave a dispatch hint, return the :class:`AppendMessageResult`.
* :func:`py_build_runs` — group a batch of hints into consume-queue runs of packed 20-byte units.

The compiled one-call put (``put_plain``, see :mod:`broker_sim.store.put_path`) does not go through the
two tuples: it runs ``prepare``'s checks, then, under the lock, writes the record straight into the mapped
segment and does ``place``'s bookkeeping — the same bytes, hint and result as ``py_place(py_prepare(…))``.

The C twin must give the same bytes, tuples, results and exceptions; whenever it meets input it does not
handle itself (a non-``str`` property, a non-``bytes`` body, any field that fails a check) it calls the
Python function, so every error message comes from one place. ``tests/broker_sim/store/test_codec.py``
proves equality with hypothesis and runs the store on both; ``BROKER_SIM_PURE_PYTHON=1`` (or a missing
extension) selects the fallback.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from broker_sim.store.config import SCHEDULE_TOPIC
from broker_sim.store.errors import MessageIllegalError, PropertiesSizeExceededError
from broker_sim.store.mapped_file import MappedFile
from broker_sim.store.mapped_file_queue import MappedFileQueue
from broker_sim.store.message_record import (
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
    tags_hash,
)
from broker_sim.store.results import (
    AppendMessageResult,
    AppendMessageStatus,
    PutMessageResult,
    PutMessageStatus,
)

POSITION = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET at record byte 20
STORE_TS_AT = 56
# consume-queue unit: 0 commitLogOffset i64 | 8 size i32 | 12 tagsCode i64
UNIT = struct.Struct(">qiq")
#: TAGS value of a hint whose properties do not survive a decode unchanged (a name or value holding
#: \x01/\x02): the dispatcher then decodes ``props_b`` exactly as it would from disk.
TAGS_UNKNOWN = "\x00unknown"
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux ≥ 5.14
_PUT_OK = AppendMessageStatus.PUT_OK

# (record with QUEUEOFFSET/PHYSICALOFFSET/STORETIMESTAMP zero, (topic, queue id), counts in queue,
#  store host, TAGS value or None or TAGS_UNKNOWN, raw properties, sys flag, prepared-tx offset)
Prepared = tuple[bytes, tuple[str, int], bool, bytes, str | None, bytes, int, int]
# (log end before the append, physical offset, size, topic, queue id, queue offset, store timestamp,
#  sys flag, prepared-tx offset, TAGS value (see TAGS_UNKNOWN), raw properties)
DispatchHint = tuple[int, int, int, str, int, int, int, int, int, str | None, bytes]
# (topic, queue id, first queue offset, packed units) — consecutive queue offsets of one queue
Run = tuple[str, int, int, bytes]
PrepareFn = Callable[[MessageInner, bytes, dict[str, bytes], int, int], Prepared]


class AppendTarget(Protocol):
    """What placing a record needs of the commit log (:class:`broker_sim.store.commit_log.CommitLog` is
    one): its files, the per-queue offsets, the dispatch hints, the prefault mark and the newest append. A
    protocol here, so the codec does not import the commit log that imports it."""

    mfq: MappedFileQueue
    file_size: int
    topic_queue_table: dict[tuple[str, int], int]
    dispatch_hints: deque[DispatchHint]
    max_hints: int
    prefault_mark: int
    prefault_wake: Callable[[], None]
    last_append: tuple[int, int]

    def roll(self, size: int) -> MappedFile: ...


PlaceFn = Callable[[AppendTarget, Prepared, int], AppendMessageResult]
BuildRunsFn = Callable[[Sequence[DispatchHint], Callable[[DispatchHint], int], bool, bool], "RunsAndCodes"]
RunsAndCodes = tuple[list[Run], list[int]]
TakeHintsFn = Callable[["deque[DispatchHint]", int, int, int], tuple[list[DispatchHint], int]]


def py_prepare(
    msg: MessageInner,
    store_host: bytes,
    topic_fields: dict[str, bytes],
    max_message_size: int,
    file_size: int,
) -> Prepared:
    """Validate and encode everything that does not depend on the append position."""
    topic_field = topic_fields.get(msg.topic)
    if topic_field is None:
        raw = check_topic(msg.topic)
        topic_field = bytes((len(raw),)) + raw
        topic_fields[msg.topic] = topic_field
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
    if blen > max_message_size:
        raise MessageIllegalError(f"body is {blen} bytes, more than max_message_size {max_message_size}")
    size = FIXED_SIZE - 1 + blen + len(topic_field) + plen
    if size + END_FILE_MIN_BLANK > file_size:
        raise MessageIllegalError(f"a {size}-byte record cannot fit a {file_size}-byte segment")
    qid = msg.queue_id
    if not 0 <= qid <= 0x7FFFFFFF:
        raise MessageIllegalError(f"queue id {qid} out of range")
    sys_flag = msg.sys_flag
    if sys_flag & 0x30:
        raise MessageIllegalError("IPv6 hosts are not supported (sysFlag 0x10/0x20)")
    tran = sys_flag & 0xC
    shost = store_host if msg.store_host is None else host_bytes(msg.store_host)
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


def py_place(cl: AppendTarget, p: Prepared, now: int) -> AppendMessageResult:
    """Append one prepared record at the end of the log (commit-log lock held)."""
    record, key, counted = p[0], p[1], p[2]
    size = len(record)
    prev_end = cl.mfq.max_offset
    files = cl.mfq.files
    mf = files[-1] if files else None
    if mf is None or size + END_FILE_MIN_BLANK > cl.file_size - mf.wrote:
        mf = cl.roll(size)
    pos = mf.wrote
    phys = mf.file_from_offset + pos
    table = cl.topic_queue_table
    qoff = table.get(key, 0) if counted else 0
    mm = mf.mm
    mm[pos : pos + size] = record
    POSITION.pack_into(mm, pos + 20, qoff, phys)
    I64.pack_into(mm, pos + STORE_TS_AT, now)
    mf.wrote = pos + size
    if counted:
        table[key] = qoff + 1
    hints = cl.dispatch_hints
    if len(hints) < cl.max_hints:
        hints.append((prev_end, phys, size, key[0], key[1], qoff, now, p[6], p[7], p[4], p[5]))
    if phys + size >= cl.prefault_mark:
        cl.prefault_wake()
    cl.last_append = (phys + size, now)
    return AppendMessageResult(_PUT_OK, phys, size, qoff, now, 1, p[3])


def py_take_hints(
    hints: deque[DispatchHint], offset: int, end: int, limit: int
) -> tuple[list[DispatchHint], int]:
    """Pop up to ``limit`` hints that continue exactly from ``offset`` and end by ``end``; returns them and
    the offset after the last one (hints that do not continue from there are left in place)."""
    batch: list[DispatchHint] = []
    while hints and len(batch) < limit:
        h = hints[0]
        if h[0] > offset or h[1] < offset or h[1] + h[2] > end:
            break
        hints.popleft()
        batch.append(h)
        offset = h[1] + h[2]
    return batch, offset


def py_build_runs(
    batch: Sequence[DispatchHint], special: Callable[[DispatchHint], int], all_special: bool, build_cq: bool
) -> RunsAndCodes:
    """Tag codes of ``batch`` and its consume-queue runs, in write order (a queue's runs in offset order).

    A record's tag code is ``String.hashCode(TAGS)`` (0 without tags) unless it needs the properties decoded
    (TAGS_UNKNOWN, the schedule topic) or ``all_special`` (a tags-code hook is set): then ``special(hint)``.
    Half and rollback transaction records get no unit."""
    runs: list[list[Any]] = []
    open_runs: dict[tuple[str, int], list[Any]] = {}
    codes: list[int] = []
    for h in batch:
        _, phys, size, topic, qid, qoff, _, sys_flag, _, tags, _ = h
        if all_special or tags is TAGS_UNKNOWN or topic == SCHEDULE_TOPIC:
            code = special(h)
        else:
            code = tags_hash(tags) if tags else 0
        codes.append(code)
        tran = sys_flag & 0xC
        if build_cq and tran != 0x4 and tran != 0xC:
            run = open_runs.get((topic, qid))
            if run is None or run[2] + run[3] != qoff:
                run = open_runs[(topic, qid)] = [topic, qid, qoff, 0, bytearray()]
                runs.append(run)
            run[3] += 1
            run[4] += UNIT.pack(phys, size, code)
    return [(r[0], r[1], r[2], bytes(r[4])) for r in runs], codes


def py_populate(mm: mmap.mmap, start: int, length: int) -> bool:
    """Prefault ``mm[start:start+length]`` for writing (MADV_POPULATE_WRITE); False where unsupported."""
    page = mmap.PAGESIZE
    lo = start - start % page
    try:
        mm.madvise(MADV_POPULATE_WRITE, lo, min(len(mm), start + length) - lo)
    except (OSError, ValueError):
        return False
    return True


def py_now_ms() -> int:
    return time.time_ns() // 1_000_000


def _load_compiled() -> Any:
    if os.environ.get("BROKER_SIM_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from broker_sim.store import _codec  # type: ignore[attr-defined]
    except ImportError:
        return None
    _codec.configure(
        py_prepare, check_topic, host_bytes, TAGS_UNKNOWN, zlib.crc32, AppendMessageResult, _PUT_OK,
        SCHEDULE_TOPIC, py_build_runs, PutMessageResult, PutMessageStatus.PUT_OK, MessageInner, MappedFile,
    )  # fmt: skip
    return _codec


compiled: Any = _load_compiled()
#: "c" or "python": which implementation :func:`implementation` hands out by default
IMPL = "c" if compiled is not None else "python"


class Codec(NamedTuple):
    prepare: PrepareFn
    place: PlaceFn
    take_hints: TakeHintsFn
    build_runs: BuildRunsFn
    now_ms: Callable[[], int]
    populate: Callable[[mmap.mmap, int, int], bool]


def implementation(name: str | None = None) -> Codec:
    """The functions of ``name`` ("c"/"python"; default :data:`IMPL`)."""
    if (name or IMPL) == "c":
        if compiled is None:
            raise RuntimeError("the compiled codec is not built (pip install -e . builds it)")
        c = compiled
        return Codec(c.prepare, c.place, c.take_hints, c.build_runs, c.now_ms, c.populate)
    return Codec(py_prepare, py_place, py_take_hints, py_build_runs, py_now_ms, py_populate)
