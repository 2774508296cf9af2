"""The read side of :class:`~broker_sim.store.message_store.MessageStore`: get by queue offset (with
RocketMQ's statuses and next-offset rules), get by physical offset, query by key, and the offset/time
lookups. An object the :class:`MessageStore` owns (``store.reader``); the store exposes its methods under the
same names, so the facade keeps one public surface while each module stays small."""

from __future__ import annotations

from collections.abc import Callable

from broker_sim.store.commit_log import CommitLog
from broker_sim.store.config import StoreConfig
from broker_sim.store.consume_queue import ConsumeQueue
from broker_sim.store.errors import StoreNotRunningError
from broker_sim.store.index_service import IndexService
from broker_sim.store.message_record import MessageExt, decode_record
from broker_sim.store.results import (
    GetMessageResult,
    GetMessageStatus,
    MessageFilter,
    QueryMessageResult,
    SelectedMessage,
)

_MAX_TS = 2**63 - 1


class StoreReader:
    """Reads over the store's commit log, consume queues (the store's own dict, filled as queues appear) and
    index; ``is_running`` tells whether the store is open."""

    def __init__(
        self,
        config: StoreConfig,
        commit_log: CommitLog,
        index: IndexService | None,
        cqs: dict[tuple[str, int], ConsumeQueue],
        is_running: Callable[[], bool],
    ) -> None:
        self.config = config
        self.commit_log = commit_log
        self.index = index
        self._cqs = cqs
        self._is_running = is_running

    # ================================================================================== get
    def _require_running(self) -> None:
        if not self._is_running():
            raise StoreNotRunningError("message store is not running")

    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        message_filter: MessageFilter = None,
        *,
        record_filter: Callable[[bytes], bool] | None = None,
    ) -> GetMessageResult:
        """Read up to ``max_msg_nums`` messages of topic/queue from queue ``offset`` (RocketMQ's getMessage:
        same statuses, same ``next_begin_offset`` rules, same 256 KiB / 32-message batch cap). ``group`` is
        accepted for parity and logging; offsets are the messaging layer's business."""
        if not self._is_running():
            raise StoreNotRunningError("message store is not running")
        cq = self._cqs.get((topic, queue_id))
        hi = 0 if cq is None else cq.max_offset
        moved = self._corrected
        if cq is None or hi == 0:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, moved(offset, 0), 0, 0)
        lo = cq.min_offset
        if offset < lo:
            return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, moved(offset, lo), lo, hi)
        if offset == hi:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
        if offset > hi:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, moved(offset, hi), lo, hi)
        cfg = self.config
        max_units = max(cfg.max_filter_units, max_msg_nums * 20) // 20
        cl = self.commit_log
        cl_min = cl.min_offset
        find = cl.mfq.find
        if message_filter is None:
            match = None
        elif callable(message_filter):
            match = message_filter
        else:
            match = message_filter.__contains__
        limit_n = min(max_msg_nums, cfg.max_transfer_count)
        limit_b = cfg.max_transfer_bytes
        msgs: list[SelectedMessage] = []
        add = msgs.append
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        total = 0
        qoff = offset  # queue offset of the next unit; scanned = qoff - offset
        # the segment of the previous record, so consecutive records cost one slice each
        mm, base, valid_end = None, 0, -1
        last_phys = -1  # commit-log offset of the last unit looked at (maxPhyOffsetPulling)
        for phys, size, tags in cq.iter_units(offset, max_units):
            last_phys = phys
            if total + size > limit_b and msgs:
                break
            qoff += 1
            if match is not None and not match(tags):
                if phys < cl_min:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                continue
            if phys < base or phys + size > valid_end:  # not in the segment at hand (base >= cl_min)
                if phys < cl_min:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                    continue
                mf = find(phys)
                if mf is None:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                    continue
                mm, base, valid_end = mf.mm, mf.file_from_offset, mf.file_from_offset + mf.wrote
                if phys + size > valid_end:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                    continue
            local = phys - base
            try:
                raw = mm[local : local + size]  # type: ignore[index]
            except ValueError:  # the segment was deleted and its mapping closed meanwhile
                status = GetMessageStatus.MESSAGE_WAS_REMOVING
                continue
            if record_filter is not None and not record_filter(raw):
                continue  # the commit-log stage of a property (SQL92) filter
            add(SelectedMessage(raw, phys, qoff - 1, tags))
            total += size
            limit_n -= 1
            if limit_n <= 0:
                break
        scanned = qoff - offset
        slow = last_phys >= 0 and cl.max_offset - last_phys > self.memory_share()
        if msgs:
            return GetMessageResult(GetMessageStatus.FOUND, offset + scanned, lo, hi, msgs, slow)
        if scanned == 0:
            per = cfg.consume_queue_units
            next_file = offset + per - offset % per
            return GetMessageResult(GetMessageStatus.OFFSET_FOUND_NULL, moved(offset, next_file), lo, hi)
        return GetMessageResult(status, offset + scanned, lo, hi, suggest_pulling_from_slave=slow)

    def _corrected(self, offset: int, new: int) -> int:
        """``nextOffsetCorrection``: where a reader whose offset is out of range goes next — ``new`` where the
        store moves readers (a master), else its own offset. A slave may be behind its master (dispatch lag,
        an unreplicated tail, only the master's last segment copied), so what it lacks is no reason to move a
        consumer."""
        return new if self.config.moves_readers else offset

    def memory_share(self) -> int:
        """Bytes of the commit log's tail RocketMQ counts as "in memory":
        ``total_physical_memory_bytes × access_message_in_memory_max_ratio %`` (a broker option, so a test
        can make it small)."""
        return self.config.total_physical_memory_bytes * self.config.access_message_in_memory_max_ratio // 100

    def select_one_message_by_offset(self, phys_offset: int, size: int = 0) -> bytes | None:
        """The raw record at a commit-log offset (None if absent)."""
        return self.commit_log.record_at(phys_offset, size)

    def look_message_by_offset(self, phys_offset: int, size: int = 0) -> MessageExt | None:
        raw = self.commit_log.record_at(phys_offset, size)
        return None if raw is None else decode_record(raw)

    def query_message(
        self, topic: str, key: str, max_num: int = 32, begin_ts: int = 0, end_ts: int = _MAX_TS
    ) -> QueryMessageResult:
        """Messages of ``topic`` whose KEYS contain ``key`` or whose UNIQ_KEY is ``key``, stored within
        [begin_ts, end_ts] (index precision: one second), newest first."""
        self._require_running()
        result = QueryMessageResult()
        if self.index is None:
            return result
        result.index_last_update_timestamp, result.index_last_update_phy_offset = self.index.last_update()
        for phys in sorted(set(self.index.query(topic, key, max_num * 2, begin_ts, end_ts)), reverse=True):
            raw = self.commit_log.record_at(phys)
            if raw is None:
                continue
            sel = SelectedMessage(raw, phys, 0, 0)
            ext = sel.ext
            if ext.topic == topic and (key in ext.keys or ext.uniq_key == key):
                sel.queue_offset = ext.queue_offset
                result.messages.append(sel)
                if len(result.messages) >= max_num:
                    break
        return result

    # ================================================================================== offsets
    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self._cqs.get((topic, queue_id))
        return 0 if cq is None else cq.max_offset

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self._cqs.get((topic, queue_id))
        return 0 if cq is None else cq.min_offset

    def get_commit_log_offset_in_queue(self, topic: str, queue_id: int, cq_offset: int) -> int:
        cq = self._cqs.get((topic, queue_id))
        unit = None if cq is None else cq.get(cq_offset)
        return 0 if unit is None else unit[0]

    def consume_queue_units(
        self, topic: str, queue_id: int, start: int, count: int
    ) -> list[tuple[int, int, int, int]]:
        """``(queueOffset, commitLogOffset, size, tagsCode)`` of up to ``count`` units from ``start``."""
        cq = self._cqs.get((topic, queue_id))
        out = []
        for offset in range(max(start, 0), max(start, 0) + max(count, 0)):
            unit = None if cq is None else cq.get(offset)
            if unit is None:
                break
            out.append((offset, *unit))
        return out

    def check_in_disk_by_consume_offset(self, topic: str, queue_id: int, cq_offset: int) -> bool:
        """``DefaultMessageStore.checkInDiskByConsumeOffset``: True when the message at ``cq_offset`` lies
        further behind the commit log's end than the share of memory RocketMQ keeps hot
        (``total_physical_memory_bytes × access_message_in_memory_max_ratio %``); False when the queue or the
        unit does not exist."""
        cq = self._cqs.get((topic, queue_id))
        unit = None if cq is None else cq.get(cq_offset)
        if unit is None:
            return False
        return self.commit_log.max_offset - unit[0] > self.memory_share()

    def get_message_store_timestamp(self, topic: str, queue_id: int, cq_offset: int) -> int:
        cq = self._cqs.get((topic, queue_id))
        unit = None if cq is None else cq.get(cq_offset)
        ts = None if unit is None else self._store_time(unit[0], unit[1])
        return -1 if ts is None else ts

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int:
        """Store time of the oldest message still in the queue (-1 if none)."""
        return self.get_message_store_timestamp(
            topic, queue_id, self.get_min_offset_in_queue(topic, queue_id)
        )

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        """First queue offset stored at or after ``timestamp`` (max offset if none)."""
        cq = self._cqs.get((topic, queue_id))
        return 0 if cq is None else cq.offset_by_time(timestamp, self._store_time)

    def _store_time(self, phys: int, size: int) -> int | None:
        raw = self.commit_log.record_at(phys, size)
        return None if raw is None else int.from_bytes(raw[56:64], "big", signed=True)

    def topic_queue_ids(self) -> dict[str, list[int]]:
        """Every topic with a consume queue, and its queue ids."""
        out: dict[str, list[int]] = {}
        for topic, qid in sorted(self._cqs):
            out.setdefault(topic, []).append(qid)
        return out
