"""Delayed delivery (RocketMQ's ScheduleMessageService).

The store parks a message with DELAY level *L* on ``SCHEDULE_TOPIC_XXXX`` queue ``L − 1``; its consume-queue
tag code is the delivery time. For each level this service walks its queue in order and, once the broker
clock reaches a message's delivery time, stores a copy on the real topic/queue (REAL_TOPIC/REAL_QID) without
DELAY. Queue order is delivery order because every message of one level has the same delay. Progress per
level is kept in ``config/delayOffset.json`` every 10 s and at shutdown; after a crash the unsaved part is
delivered again (a duplicate, as in RocketMQ).

Nothing polls: a level is examined when a message is dispatched onto it, at start, and at the clock time its
head message falls due, so a ManualClock test controls exactly when each retry comes back.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from broker_sim.common.constants import SCHEDULE_TOPIC
from broker_sim.common.message import Prop
from broker_sim.store.config_files import load_delay_offsets, save_delay_offsets
from broker_sim.store.message_record import MessageInner
from broker_sim.store.results import DispatchRequest, GetMessageStatus

if TYPE_CHECKING:
    from broker_sim.broker.context import BrokerContext

log = logging.getLogger(__name__)


class ScheduleMessageService:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self.levels_ms: list[int] = list(broker.store.config.delay_levels_ms)
        self._lock = threading.Lock()
        self.offsets: dict[int, int] = {}
        self._armed: dict[
            int, int
        ] = {}  # level -> due time of the pending timer (-1: immediate check queued)
        self.delivered = 0

    def load(self) -> None:
        """The saved offsets, each clamped into its level's queue as recovered (``correctDelayOffset``):
        after a power cut the schedule queue can come back shorter than the saved offset, and the offsets
        it lost are reused by new delayed messages and retries — left above the queue's end, they would
        be skipped for ever."""
        store = self.broker.store
        saved = load_delay_offsets(store.config_dir)
        self.offsets = {
            level: min(max(offset, store.get_min_offset_in_queue(SCHEDULE_TOPIC, level - 1)),
                       store.get_max_offset_in_queue(SCHEDULE_TOPIC, level - 1))
            for level, offset in saved.items()
        }  # fmt: skip

    def persist(self) -> None:
        with self._lock:
            table = dict(self.offsets)
        save_delay_offsets(self.broker.store.config_dir, table)

    def start(self) -> None:
        for level in range(1, len(self.levels_ms) + 1):
            self._arm(level, 0)
        b = self.broker
        b.scheduler.schedule_periodic(
            b.config.flush_delay_offset_interval_ms, b.config.flush_delay_offset_interval_ms, self.persist,
            name="persist-delay-offsets",
        )  # fmt: skip

    def on_dispatch(self, req: DispatchRequest) -> None:
        if req.topic == SCHEDULE_TOPIC:
            self._arm(req.queue_id + 1, 0)

    def _arm(self, level: int, delay_ms: int) -> None:
        due = self.broker.clock.now_ms() + delay_ms
        with self._lock:
            current = self._armed.get(level)
            if current is not None and current <= due:
                return
            self._armed[level] = due
        self.broker.scheduler.schedule(
            delay_ms, lambda: self._deliver(level, due), name=f"delay-level-{level}"
        )

    def _deliver(self, level: int, due: int) -> None:
        with self._lock:
            if self._armed.get(level) == due:
                del self._armed[level]
        b = self.broker
        if not b.store.running:
            return
        qid = level - 1
        while True:
            with self._lock:
                offset = self.offsets.get(level, 0)
            result = b.store.get_message("SCHEDULE", SCHEDULE_TOPIC, qid, offset, 32, None)
            if result.status is GetMessageStatus.OFFSET_TOO_SMALL:
                with self._lock:
                    self.offsets[level] = result.next_begin_offset
                continue
            if result.status in (
                GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                GetMessageStatus.NO_MESSAGE_IN_QUEUE,
            ):
                end = b.store.get_max_offset_in_queue(SCHEDULE_TOPIC, qid)
                with self._lock:  # past the queue's end (it lost messages): go on from its end
                    moved = self.offsets.get(level, 0) > end
                    if moved:
                        self.offsets[level] = end
                if moved:
                    continue
                return
            if result.status is not GetMessageStatus.FOUND:
                return
            now = b.clock.now_ms()
            for sel in result.messages:
                deliver_at = sel.tags_code
                if deliver_at > now:
                    self._arm(level, deliver_at - now)
                    return
                try:
                    self._deliver_one(sel.ext)
                except RuntimeError:
                    self._arm(level, 10_000)  # the store refused (stopped, disk full): try again later
                    return
                with self._lock:
                    self.offsets[level] = sel.queue_offset + 1
            with self._lock:
                self.offsets[level] = max(self.offsets.get(level, 0), result.next_begin_offset)

    def _deliver_one(self, ext: object) -> None:
        from broker_sim.store.message_record import MessageExt as Stored

        assert isinstance(ext, Stored)
        props = dict(ext.properties)
        real_topic = props.pop(Prop.REAL_TOPIC, None)
        real_qid = props.pop(Prop.REAL_QID, "0")
        props.pop(Prop.DELAY, None)
        if real_topic is None:
            log.error("delayed message at %d has no REAL_TOPIC; dropped", ext.commit_log_offset)
            return
        inner = MessageInner(
            topic=real_topic,
            body=ext.body,
            queue_id=int(real_qid),
            flag=ext.flag,
            properties=props,
            sys_flag=ext.sys_flag,
            born_timestamp=ext.born_timestamp,
            born_host=ext.born_host,
            store_host=ext.store_host,
            reconsume_times=ext.reconsume_times,
            prepared_transaction_offset=ext.prepared_transaction_offset,
        )
        self.broker.ensure_topic_for_delivery(real_topic, int(real_qid))
        result = self.broker.store.put_message(inner)
        if not result.ok:
            log.error(
                "delivery of delayed message to %s failed: %s %s", real_topic, result.status, result.remark
            )
            raise RuntimeError(f"delayed delivery to {real_topic} failed: {result.status.value}")
        self.delivered += 1

    def pending(self) -> dict[int, int]:
        """level → messages parked and not yet delivered (for admin and tests)."""
        out = {}
        for level in range(1, len(self.levels_ms) + 1):
            hi = self.broker.store.get_max_offset_in_queue(SCHEDULE_TOPIC, level - 1)
            with self._lock:
                n = hi - self.offsets.get(level, 0)
            if n > 0:
                out[level] = n
        return out
