"""The pull consumer: the application chooses queues and offsets and calls :meth:`PullConsumer.pull`.

Offsets are the application's business; :meth:`update_consume_offset` records one in memory and the
consumer commits it to the broker every 5 s and at shutdown (``RemoteBrokerOffsetStore``), so a group can
resume where it left off. Pulls are not held (no SUSPEND bit) unless :meth:`pull_block_if_not_found` is used.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass, field

from broker_sim.client.client_base import ClientBase, check_group
from broker_sim.client.offset_store import ReadOffsetType, RemoteBrokerOffsetStore
from broker_sim.client.pull_nodes import PullNodeTable
from broker_sim.client.send_back import InnerProducer, send_back
from broker_sim.clock import Clock
from broker_sim.common.constants import parse_tag_expression
from broker_sim.common.errors import BrokerResponseError, ClientStateError, TransportError
from broker_sim.common.message import MessageExt, MessageQueue, SysFlag
from broker_sim.common.requests import (
    ConsumeFromWhere,
    ConsumerData,
    ConsumeType,
    ExpressionType,
    HeartbeatData,
    MessageModel,
    MessageSelector,
    Perm,
    PullMessageRequest,
    PullStatus,
    SubscriptionData,
)
from broker_sim.common.scheduler import Scheduler
from broker_sim.common.service_state import ServiceState

log = logging.getLogger(__name__)


@dataclass
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    msgs: list[MessageExt] = field(default_factory=list)


class PullConsumer(ClientBase):
    def __init__(
        self,
        broker_or_address: object,
        group: str,
        *,
        clock: Clock | None = None,
        instance_name: str | None = None,
        persist_consumer_offset_interval_ms: int = 5000,
        max_reconsume_times: int = 16,
    ) -> None:
        check_group(group)
        super().__init__(broker_or_address, clock=clock, instance_name=instance_name)
        self.group = group
        self.max_reconsume_times = max_reconsume_times
        self.inner_producer = InnerProducer(broker_or_address, self.clock)  # retry copies (send_back)
        self.offset_store = RemoteBrokerOffsetStore(self.transport, group)
        #: the node of each queue's group the next pull goes to (the last reply's suggestion)
        self.pull_nodes = PullNodeTable()
        self.persist_consumer_offset_interval_ms = persist_consumer_offset_interval_ms
        self._topics: set[str] = set()
        self._scheduler: Scheduler | None = None
        self._state: ServiceState = ServiceState.CREATED

    def start(self) -> PullConsumer:
        if self._state != ServiceState.CREATED:
            raise ClientStateError(f"pull consumer {self.group} is {self._state}")
        self._state = ServiceState.RUNNING
        self._scheduler = Scheduler(self.clock, f"pull-consumer-{self.group}")
        self._heartbeat()
        self._scheduler.schedule_periodic(30_000, 30_000, self._heartbeat, name="heartbeat")
        self._scheduler.schedule_periodic(
            self.persist_consumer_offset_interval_ms,
            self.persist_consumer_offset_interval_ms,
            self.persist_offsets,
            name="persist-offsets",
        )
        return self

    def shutdown(self) -> None:
        if self._state != ServiceState.RUNNING:
            self._state = ServiceState.SHUTDOWN
            return
        self._state = ServiceState.SHUTDOWN
        assert self._scheduler is not None
        self._scheduler.shutdown()
        self.persist_offsets()
        try:
            self.transport.unregister_client(self.client_id, None, self.group)
        except (TransportError, BrokerResponseError) as exc:
            log.warning("%s: unregister failed: %s", self.group, exc)
        self.inner_producer.shutdown()
        self.transport.close()

    def _check(self) -> None:
        if self._state != ServiceState.RUNNING:
            raise ClientStateError(f"pull consumer {self.group} is not running (call start())")

    def _heartbeat(self) -> None:
        subs = tuple(SubscriptionData(t, "*") for t in sorted(self._topics))
        data = ConsumerData(
            self.group, ConsumeType.CONSUME_ACTIVELY, MessageModel.CLUSTERING,
            ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, subs,
        )  # fmt: skip
        try:
            self.transport.heartbeat(HeartbeatData(self.client_id, consumers=(data,)), self)
        except (TransportError, BrokerResponseError) as exc:
            log.warning("%s: heartbeat failed: %s", self.group, exc)

    def persist_offsets(self) -> None:
        self.offset_store.persist_all(self.offset_store.snapshot().keys())

    def fetch_subscribe_message_queues(self, topic: str) -> list[MessageQueue]:
        self._check()
        route = self.transport.get_route(topic)
        self._topics.add(topic)
        out: list[MessageQueue] = []
        for qd in route.queue_datas:
            if qd.perm & Perm.READ:
                out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
        return sorted(out)

    def pull(
        self, mq: MessageQueue, expression: str | MessageSelector, offset: int, max_nums: int = 32
    ) -> PullResult:
        """One pull from ``offset``: FOUND with messages, NO_NEW_MSG, NO_MATCHED_MSG or OFFSET_ILLEGAL.
        ``expression`` is a tag expression or a ``MessageSelector.by_sql(...)`` (the broker refuses SQL92
        unless it runs with ``enable_property_filter``)."""
        return self._pull(mq, expression, offset, max_nums, suspend_ms=0)

    def pull_block_if_not_found(
        self,
        mq: MessageQueue,
        expression: str | MessageSelector,
        offset: int,
        max_nums: int = 32,
        timeout_ms: int = 15_000,
    ) -> PullResult:
        """As :meth:`pull`, but the broker holds the request up to ``timeout_ms`` when nothing is there
        yet."""
        return self._pull(mq, expression, offset, max_nums, suspend_ms=timeout_ms)

    def _pull(
        self, mq: MessageQueue, expression: str | MessageSelector, offset: int, max_nums: int, suspend_ms: int
    ) -> PullResult:
        self._check()
        if offset < 0 or max_nums <= 0:
            raise ValueError("offset must be >= 0 and max_nums > 0")
        selector = MessageSelector.of(expression)
        sql = selector.expression_type is ExpressionType.SQL92
        tags = None if sql else parse_tag_expression(selector.expression)
        sys_flag = SysFlag.PULL_SUBSCRIPTION | (SysFlag.PULL_SUSPEND if suspend_ms > 0 else 0)
        req = PullMessageRequest(
            self.group, mq.topic, mq.queue_id, offset, max_nums, sys_flag, 0, suspend_ms, selector.expression,
            expression_type=selector.expression_type, broker_name=mq.broker_name,
            broker_id=self.pull_nodes.node(mq),
        )  # fmt: skip
        resp = self.transport.pull_message(req, timeout_ms=suspend_ms + 30_000)
        self.pull_nodes.update(mq, resp.suggest_which_broker_id)
        msgs = [m for m in resp.messages if tags is None or m.tags in tags]
        for m in msgs:
            m.broker_name = mq.broker_name
            if m.sys_flag & SysFlag.COMPRESSED:
                m.body = zlib.decompress(m.body)
                m.sys_flag &= ~SysFlag.COMPRESSED
        status = resp.status
        if status is PullStatus.FOUND and not msgs:
            status = PullStatus.NO_MATCHED_MSG
        return PullResult(status, resp.next_begin_offset, resp.min_offset, resp.max_offset, msgs)

    def update_consume_offset(self, mq: MessageQueue, offset: int) -> None:
        self._check()
        self.offset_store.update_offset(mq, offset, False)

    def fetch_consume_offset(self, mq: MessageQueue, from_store: bool = True) -> int:
        self._check()
        how = ReadOffsetType.READ_FROM_STORE if from_store else ReadOffsetType.MEMORY_FIRST_THEN_STORE
        return self.offset_store.read_offset(mq, how)

    def max_offset(self, mq: MessageQueue) -> int:
        return self.transport.get_max_offset(mq.topic, mq.queue_id, mq.broker_name)

    def min_offset(self, mq: MessageQueue) -> int:
        return self.transport.get_min_offset(mq.topic, mq.queue_id, mq.broker_name)

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self.transport.search_offset_by_timestamp(mq.topic, mq.queue_id, timestamp_ms, mq.broker_name)

    def send_message_back(self, msg: MessageExt, delay_level: int = 0) -> None:
        """Hand a failed message to the broker's retry path (``%RETRY%`` or, past the maximum, ``%DLQ%``);
        when its broker cannot take it, a retry copy goes through the client's own producer
        (:mod:`broker_sim.client.send_back`)."""
        self._check()
        send_back(self, msg, delay_level)
