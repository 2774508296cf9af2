"""Consume services: run the listener over pulled messages and turn its answer into offsets and retries.

Concurrent: a thread pool; each batch of up to ``consume_message_batch_max_size`` messages is one task.
RECONSUME_LATER (or an exception, or returning nothing) sends every message of the batch back to the broker
(→ ``%RETRY%{group}``, or ``%DLQ%{group}`` after the maximum); the queue's commit offset then moves to the
smallest message still in flight, so one slow message holds it back while the others complete.

Orderly: one task per queue at a time (the queue's consume lock) and only while the broker lock is held; a
failed batch is suspended and retried *locally* after ``suspend_current_queue_time_ms`` so later messages of
the queue wait behind it, and after ``max_reconsume_times`` it goes to the DLQ and the queue moves on.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol, Union

from broker_sim.client.process_queue import ProcessQueue
from broker_sim.client.send_back import SendBackHost
from broker_sim.common.constants import RETRY_GROUP_TOPIC_PREFIX
from broker_sim.common.message import (
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageExt,
    MessageQueue,
    Prop,
    SysFlag,
)
from broker_sim.common.requests import MessageModel

if TYPE_CHECKING:
    from broker_sim.client.offset_store import OffsetStore
    from broker_sim.client.rebalance import Rebalancer
    from broker_sim.clock import Clock
    from broker_sim.common.scheduler import Scheduler

log = logging.getLogger(__name__)


class ConsumeHost(SendBackHost, Protocol):
    """What the consume services read of the push consumer that owns them (its listener results move the
    consumer's offsets; a failed message goes back to the broker through it)."""

    clock: Clock
    stopped: bool
    message_model: MessageModel
    scheduler: Scheduler
    offset_store: OffsetStore
    rebalancer: Rebalancer
    consume_message_batch_max_size: int
    consume_timeout_ms: int
    suspend_current_queue_time_ms: int

    def send_message_back(self, msg: MessageExt, delay_level: int) -> bool: ...


MessageListener = Callable[[list[MessageExt]], Union[ConsumeStatus, None]]  # noqa: UP007
OrderlyListener = Callable[[list[MessageExt]], Union[ConsumeOrderlyStatus, ConsumeStatus, None]]  # noqa: UP007


def prepare_for_listener(msgs: Sequence[MessageExt], group: str, now_ms: int) -> None:
    """What the client does before a listener sees messages: decompress, restore the original topic of a
    retry delivery (listeners never see ``%RETRY%``), stamp the consume start time (for the 15-min
    timeout)."""
    retry = RETRY_GROUP_TOPIC_PREFIX + group
    for m in msgs:
        if m.sys_flag & SysFlag.COMPRESSED:
            try:
                m.body = zlib.decompress(m.body)
                m.sys_flag &= ~SysFlag.COMPRESSED
            except zlib.error:
                log.error("message %s: compressed body does not inflate; delivered as stored", m.msg_id)
        original = m.properties.get(Prop.RETRY_TOPIC)
        if original and m.topic == retry:
            m.topic = original
        m.properties[Prop.CONSUME_START_TIME] = str(now_ms)


class ConcurrentConsumeService:
    def __init__(self, consumer: ConsumeHost, listener: MessageListener, threads: int) -> None:
        self.consumer = consumer
        self.listener = listener
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix=f"consume-{consumer.group}")
        self.consumed = 0  # listener calls completed (for tests / stats)
        self.failed = 0

    def submit(self, msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue, dispatch: bool) -> None:
        size = max(1, self.consumer.consume_message_batch_max_size)
        for i in range(0, len(msgs), size):
            self._submit_batch(msgs[i : i + size], pq, mq)

    def _submit_batch(self, batch: list[MessageExt], pq: ProcessQueue, mq: MessageQueue) -> None:
        try:
            self.executor.submit(self._consume, batch, pq, mq)
        except RuntimeError:  # executor shut down: the consumer is stopping; the offset was not advanced
            log.debug("consumer %s stopping: batch at %s dropped", self.consumer.group, batch[0].queue_offset)

    def _consume(self, msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue) -> None:
        c = self.consumer
        if pq.dropped or c.stopped:
            return
        prepare_for_listener(msgs, c.group, c.clock.now_ms())
        status: ConsumeStatus | None
        try:
            status = self.listener(list(msgs))
        except Exception:
            log.exception("listener of %s raised on %s (offsets %s…)", c.group, mq, msgs[0].queue_offset)
            status = None
        if not isinstance(status, ConsumeStatus):
            status = ConsumeStatus.RECONSUME_LATER
        if pq.dropped:
            # The queue was rebalanced away or the consumer killed while the listener ran: RocketMQ drops the
            # result, so the new owner consumes these messages again from the committed offset. A graceful
            # shutdown is not a drop: it waits for this call and persists the offsets after its result.
            log.info("%s: result for %s dropped (queue no longer ours)", c.group, mq)
            return
        self.consumed += 1
        self._process_result(status, msgs, pq, mq)

    def _process_result(
        self, status: ConsumeStatus, msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue
    ) -> None:
        c = self.consumer
        if status is ConsumeStatus.RECONSUME_LATER:
            self.failed += 1
            if c.message_model is MessageModel.BROADCASTING:
                for m in msgs:
                    log.warning(
                        "broadcasting: consume of %s failed; dropped (no retry in broadcasting)", m.msg_id
                    )
            else:
                retry_locally = [m for m in msgs if not c.send_message_back(m, 0)]
                if retry_locally:
                    for m in retry_locally:
                        m.reconsume_times += 1
                    msgs = [m for m in msgs if m not in retry_locally]
                    c.scheduler.schedule(
                        5000, lambda: self._submit_batch(retry_locally, pq, mq), name="local-retry"
                    )
        offset = pq.remove_messages(msgs)
        if offset >= 0 and not pq.dropped:
            c.offset_store.update_offset(mq, offset, True)

    def clean_expired(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        """Consume timeout: messages stuck in a listener longer than ``consume_timeout_ms`` are sent back
        (delay level 3) and removed, so the queue's offset can move on (RocketMQ's ``cleanExpiredMsg``)."""
        c = self.consumer
        for m in pq.expired_messages(c.clock.now_ms(), c.consume_timeout_ms):
            log.warning(
                "%s: message %s at %s@%d exceeded the consume timeout; sent back",
                c.group,
                m.msg_id,
                mq,
                m.queue_offset,
            )
            c.send_message_back(m, 3)
            off = pq.remove_messages([m])
            if off >= 0 and not pq.dropped:
                c.offset_store.update_offset(mq, off, True)

    def shutdown(self, wait: bool) -> None:
        self.executor.shutdown(wait=wait, cancel_futures=not wait)


class OrderlyConsumeService:
    MAX_TIME_CONSUME_CONTINUOUSLY_MS = 60_000

    def __init__(self, consumer: ConsumeHost, listener: OrderlyListener, threads: int) -> None:
        self.consumer = consumer
        self.listener = listener
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix=f"orderly-{consumer.group}")
        self.consumed = 0
        self.failed = 0

    def submit(self, msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue, dispatch: bool) -> None:
        if dispatch:
            self._submit(pq, mq)

    def _submit(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        try:
            self.executor.submit(self._run, pq, mq)
        except RuntimeError:
            log.debug("orderly consumer %s stopping", self.consumer.group)

    def _later(self, pq: ProcessQueue, mq: MessageQueue, delay_ms: int) -> None:
        self.consumer.scheduler.schedule(delay_ms, lambda: self._submit(pq, mq), name="orderly-later")

    def _run(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        c = self.consumer
        if pq.dropped or c.stopped:
            return
        with pq.consume_lock:  # one thread per queue
            clustering = c.message_model is MessageModel.CLUSTERING
            begin = c.clock.now_ms()
            while not pq.dropped and not c.stopped:
                if clustering and (not pq.locked or pq.is_lock_expired(c.clock.now_ms())):
                    c.rebalancer.try_lock_later(mq, lambda: self._submit(pq, mq))
                    return
                if c.clock.now_ms() - begin > self.MAX_TIME_CONSUME_CONTINUOUSLY_MS:
                    self._later(pq, mq, 10)
                    return
                msgs = pq.take_messages(max(1, c.consume_message_batch_max_size))
                if not msgs:
                    return  # take_messages cleared pq.consuming; the next pull dispatches again
                prepare_for_listener(msgs, c.group, c.clock.now_ms())
                try:
                    raw = self.listener(list(msgs))
                except Exception:
                    log.exception("orderly listener of %s raised on %s@%d", c.group, mq, msgs[0].queue_offset)
                    raw = None
                ok = raw in (ConsumeOrderlyStatus.SUCCESS, ConsumeStatus.CONSUME_SUCCESS)
                if pq.dropped:  # rebalanced away or killed; a graceful shutdown still commits this batch
                    return
                self.consumed += 1
                if ok:
                    commit = pq.commit()
                else:
                    self.failed += 1
                    if self._must_suspend(msgs):
                        for m in msgs:
                            m.reconsume_times += 1
                        pq.make_message_to_consume_again(msgs)
                        self._later(pq, mq, c.suspend_current_queue_time_ms)
                        return
                    commit = pq.commit()  # every failed message reached the DLQ: move on
                if commit >= 0:
                    c.offset_store.update_offset(mq, commit, False)

    def _must_suspend(self, msgs: list[MessageExt]) -> bool:
        """True to retry locally; False when every message hit the maximum and was dead-lettered."""
        c = self.consumer
        suspend = False
        for m in msgs:
            if m.reconsume_times >= c.max_reconsume_times:
                if not c.send_message_back(m, -1):
                    suspend = True
            else:
                suspend = True
        return suspend

    def shutdown(self, wait: bool) -> None:
        self.executor.shutdown(wait=wait, cancel_futures=not wait)
