"""The dispatcher (RocketMQ's ``ReputMessageService``): reads the commit log from ``reput_offset`` on and,
for each record, writes its consume-queue unit, its index entries, and tells the listeners.

The commit log is the only source of truth: recovery (and any range without hints) runs :meth:`_from_log`,
which parses the mapped bytes. For live appends the commit log leaves a ``DispatchHint`` per record (the
offsets, topic, TAGS and raw properties the append already had), and :meth:`_from_hints` uses those instead
of re-reading and re-parsing — but only for hints that start exactly where dispatch stands, so both paths
produce the same units, index entries and listener calls. Hinted units are written in runs (one slice
assignment per queue per batch). Consume-queue writes are idempotent (a unit goes to ``queueOffset × 20``),
so dispatching a range twice is harmless.

The tag code of a unit is ``String.hashCode(TAGS)`` (0 without tags); for ``SCHEDULE_TOPIC_XXXX`` it is the
delivery time: store timestamp + the delay of the record's ``DELAY`` level (clamped to the 18 levels). A
``tags_code_hook(topic, properties, store_timestamp)`` may override both (return None to keep the default).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable

from broker_sim.store.commit_log import CommitLog, DispatchHint
from broker_sim.store.config import SCHEDULE_TOPIC
from broker_sim.store.consume_queue import ConsumeQueue
from broker_sim.store.index_service import IndexService
from broker_sim.store.message_record import (
    BLANK_MAGIC,
    I16,
    MESSAGE_MAGIC,
    decode_properties,
    tags_hash,
)
from broker_sim.store.results import DispatchListener, DispatchRequest

log = logging.getLogger(__name__)

# TOTALSIZE MAGIC [crc] QUEUEID [flag] QUEUEOFFSET PHYSOFFSET SYSFLAG [born ts+host] STORETS [store host,
# reconsume] PREPARED BODYLEN — the 88-byte header with the fields dispatch does not need skipped
DISPATCH = struct.Struct(">ii4xi4xqqi16xq12xqi")
assert DISPATCH.size == 88

TagsCodeHook = Callable[[str, dict[str, str], int], int | None]


class Dispatcher:
    def __init__(
        self,
        commit_log: CommitLog,
        find_cq: Callable[[str, int], ConsumeQueue],
        index: IndexService | None,
        delay_levels_ms: list[int],
    ) -> None:
        self.commit_log = commit_log
        self.find_cq = find_cq
        self.index = index
        self.delay_levels_ms = delay_levels_ms
        self.reput_offset = 0
        self.last_store_timestamp = 0
        self.listeners: list[DispatchListener] = []
        self.tags_code_hook: TagsCodeHook | None = None
        self.listener_errors = 0
        self.lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._done = threading.Condition()
        self._thread: threading.Thread | None = None
        self._topics: dict[bytes, str] = {}

    # ------------------------------------------------------------------------------------------ core
    def dispatch_pending(self, *, notify: bool = True, end: int | None = None, build_cq: bool = True) -> int:
        """Dispatch every record between ``reput_offset`` and the commit log's end (or ``end``); returns
        how many records were dispatched. Safe to call from any thread."""
        with self.lock:
            count = self._dispatch(self.commit_log.max_offset if end is None else end, notify, build_cq)
        if count:
            with self._done:
                self._done.notify_all()
        return count

    def _dispatch(self, end: int, notify: bool, build_cq: bool) -> int:
        cl = self.commit_log
        hints = cl.dispatch_hints
        offset = max(self.reput_offset, cl.min_offset)
        count = 0
        try:
            while offset < end:
                while hints and hints[0][1] < offset:
                    hints.popleft()  # already dispatched from the log bytes
                before = offset
                if hints and hints[0][0] <= offset:
                    offset, n = self._from_hints(offset, end, notify, build_cq)
                    stop = False
                else:
                    upto = min(end, hints[0][0]) if hints else end
                    offset, n, stop = self._from_log(offset, upto, notify, build_cq)
                count += n
                if stop or offset == before:
                    break
        finally:
            self.reput_offset = max(self.reput_offset, min(offset, end))
        return count

    def _from_hints(self, offset: int, end: int, notify: bool, build_cq: bool) -> tuple[int, int]:
        """Dispatch up to 512 hinted records starting at ``offset``; returns (new offset, count)."""
        codec = self.commit_log.codec
        batch, offset = codec.take_hints(self.commit_log.dispatch_hints, offset, end, 512)
        if not batch:
            return offset, 0
        index = self.index
        listeners = self.listeners if notify else []
        runs, codes = codec.build_runs(batch, self._special_code, self.tags_code_hook is not None, build_cq)
        for topic, qid, first, units in runs:
            self.find_cq(topic, qid).put_packed(first, units)
        requests: list[tuple[object, ...]] = []
        if index is not None or listeners:
            for h, tags_code in zip(batch, codes, strict=True):
                _, phys, size, topic, qid, qoff, store_ts, sys_flag, prepared, _, props_b = h
                props = decode_properties(props_b) if props_b else {}
                if index is not None:
                    index.build(topic, props, phys, store_ts, sys_flag)
                if listeners:
                    requests.append(
                        (topic, qid, phys, size, tags_code, store_ts, qoff, sys_flag, prepared, props)
                    )
        self.last_store_timestamp = batch[-1][6]
        self.reput_offset = offset
        for fields in requests:
            self._notify(listeners, *fields)
        return offset, len(batch)

    def _special_code(self, h: DispatchHint) -> int:
        """Tag code of a hinted record whose properties must be decoded first (see ``build_runs``)."""
        props = decode_properties(h[10]) if h[10] else {}
        return self._tags_code(h[3], props, h[6])

    def _from_log(self, offset: int, end: int, notify: bool, build_cq: bool) -> tuple[int, int, bool]:
        """Dispatch records parsed from the log bytes in [offset, end); returns (new offset, count, hit
        something that is not a record)."""
        # Hot loop during recovery: one segment at a time, locals for everything looked up per record.
        cl = self.commit_log
        mfq = cl.mfq
        index = self.index
        listeners = self.listeners if notify else []
        topics = self._topics
        unpack = DISPATCH.unpack_from
        i16 = I16.unpack_from
        find_cq = self.find_cq
        cq_cache: dict[tuple[str, int], ConsumeQueue] = {}
        plain_tags = self.tags_code_hook is None
        count = 0
        last_ts = self.last_store_timestamp
        stop = False
        try:
            while offset < end and not stop:
                mf = mfq.find(offset)
                if mf is None:
                    break
                mm, base, fsize = mf.mm, mf.file_from_offset, mf.file_size
                pos = offset - base
                limit = min(mf.wrote, end - base)
                while pos < limit:
                    if pos + 88 > fsize:  # only an end-of-segment marker fits here
                        pos = fsize
                        break
                    size, magic, qid, qoff, phys, sys_flag, store_ts, prepared, blen = unpack(mm, pos)
                    if magic != MESSAGE_MAGIC:
                        if magic == BLANK_MAGIC:
                            pos = fsize
                            break
                        log.error("dispatcher: no record at %d (magic %#x): stopping", base + pos, magic)
                        stop = True
                        break
                    p = pos + 88 + blen
                    tlen = mm[p]
                    tb = mm[p + 1 : p + 1 + tlen]
                    topic = topics.get(tb)
                    if topic is None:
                        topic = topics[tb] = tb.decode("utf-8")
                    p += 1 + tlen
                    plen = i16(mm, p)[0]
                    props = decode_properties(mm[p + 2 : p + 2 + plen]) if plen > 0 else {}
                    if plain_tags and topic != SCHEDULE_TOPIC:
                        tags = props.get("TAGS")
                        tags_code = tags_hash(tags) if tags else 0
                    else:
                        tags_code = self._tags_code(topic, props, store_ts)
                    tran = sys_flag & 0xC
                    if build_cq and tran != 0x4 and tran != 0xC:
                        key = (topic, qid)
                        cq = cq_cache.get(key)
                        if cq is None:
                            cq = cq_cache[key] = find_cq(topic, qid)
                        cq.put(qoff, phys, size, tags_code)
                    if index is not None:
                        index.build(topic, props, phys, store_ts, sys_flag)
                    pos += size
                    count += 1
                    last_ts = store_ts
                    if listeners:
                        self.reput_offset = base + pos
                        self.last_store_timestamp = last_ts
                        self._notify(listeners, topic, qid, phys, size, tags_code, store_ts, qoff, sys_flag,
                                     prepared, props)  # fmt: skip
                offset = base + pos
                if pos < fsize:
                    break  # reached the end of written data inside this segment
        finally:
            self.reput_offset = max(self.reput_offset, min(offset, end))
            self.last_store_timestamp = last_ts
        return offset, count, stop

    def _notify(self, listeners: list[DispatchListener], *fields: object) -> None:
        req = DispatchRequest(*fields)  # type: ignore[arg-type]
        for fn in listeners:
            try:
                fn(req)
            except Exception:
                self.listener_errors += 1
                log.exception("dispatch listener %r failed on offset %d", fn, req.commit_log_offset)

    def _tags_code(self, topic: str, props: dict[str, str], store_ts: int) -> int:
        hook = self.tags_code_hook
        if hook is not None:
            code = hook(topic, props, store_ts)
            if code is not None:
                return code
        if topic == SCHEDULE_TOPIC:
            delay = props.get("DELAY")
            if delay is not None and delay.lstrip("-").isdigit():
                levels = self.delay_levels_ms
                level = min(max(int(delay), 1), len(levels))
                return store_ts + levels[level - 1]
        tags = props.get("TAGS")
        return tags_hash(tags) if tags else 0

    # ------------------------------------------------------------------------------------------ thread
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="broker_sim-dispatcher", daemon=True)
        self._thread.start()

    @property
    def wake_event(self) -> threading.Event:
        """Set to wake the dispatcher (what :meth:`wake` sets; the compiled put sets it directly)."""
        return self._wake

    def wake(self) -> None:
        if not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                self.dispatch_pending()
            except Exception:
                log.exception("dispatcher failed; retrying on the next wake-up")

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def behind(self) -> int:
        """Bytes of commit log not dispatched yet."""
        return max(0, self.commit_log.max_offset - self.reput_offset)

    def wait_dispatched(self, offset: int, timeout_s: float) -> bool:
        """Block (real time) until everything below ``offset`` is dispatched; True if it was in time."""
        with self._done:
            return self._done.wait_for(lambda: self.reput_offset >= offset, timeout_s)
