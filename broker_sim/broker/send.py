"""SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE (RocketMQ's ``SendMessageProcessor``): topic checks,
the stored properties (CLUSTER added, WAIT dropped), retry-topic sends past the maximum going to ``%DLQ%``,
half messages of transactions, and the reply."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from broker_sim.broker.sendback import raise_for_put
from broker_sim.broker.topics import TopicConfig
from broker_sim.common.constants import dlq_topic, is_retry_topic
from broker_sim.common.convert import parse_host
from broker_sim.common.errors import (
    BrokerResponseError,
    MessageIllegalError,
    NoPermissionError,
    TopicNotExistError,
)
from broker_sim.common.message import Prop, SysFlag
from broker_sim.common.requests import BatchEntry, Perm, ResponseCode, SendMessageRequest, SendMessageResponse
from broker_sim.store.message_record import MessageInner
from broker_sim.store.results import PutMessageStatus

if TYPE_CHECKING:
    from broker_sim.broker.context import BrokerContext
    from broker_sim.broker.transaction import TransactionService


#: SendMessageProcessor.handlePutMessageResult: a stored message whose flush or replication is late still gets
#: its message id, with one of these codes (the client reports them as a SendStatus, not an error)
_SEND_CODES = {
    PutMessageStatus.PUT_OK: ResponseCode.SUCCESS,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
}


class SendMessageService:
    """The Broker's send requests (``broker.sender``)."""

    def __init__(self, broker: BrokerContext, transactions: TransactionService) -> None:
        self.broker = broker
        #: turns a transactional send into its half message (the broker's transaction service)
        self.transactions = transactions

    def _topic_for_send(self, req: SendMessageRequest) -> TopicConfig:
        tc = self.broker.topics.select(req.topic)
        if tc is None and is_retry_topic(req.topic):
            sg = self.broker.groups.find(req.topic[len("%RETRY%") :])
            tc = self.broker.topics.create_in_send_back(req.topic, sg.retry_queue_nums, int(Perm.READ_WRITE))
        if tc is None and self.broker.config.auto_create_topic_enable:
            tc = self.broker.topics.create_in_send(req.topic, req.default_topic, req.default_topic_queue_nums)
        if tc is None:
            raise TopicNotExistError(f"topic[{req.topic}] not exist, apply first please!")
        if not tc.writable:
            raise NoPermissionError(f"the topic[{req.topic}] sending message is forbidden")
        return tc

    def _inner(
        self, req: SendMessageRequest, tc: TopicConfig, body: bytes, props: dict[str, str]
    ) -> MessageInner:
        queue_id = req.queue_id if req.queue_id >= 0 else random.randrange(tc.write_queue_nums)
        if queue_id >= tc.write_queue_nums:
            raise BrokerResponseError(
                f"request queueId[{queue_id}] is illegal, topic:{tc.topic_name} "
                f"writeQueueNums:{tc.write_queue_nums}"
            )
        topic = req.topic
        if is_retry_topic(topic):  # a client that sends retries itself (2.0+): past the maximum → DLQ
            group = topic[len("%RETRY%") :]
            limit = (
                req.max_reconsume_times
                if req.max_reconsume_times is not None
                else self.broker.groups.find(group).retry_max_times
            )
            if req.reconsume_times >= limit:
                topic = dlq_topic(group)
                self.broker.topics.create_in_send_back(topic, 1, int(Perm.READ_WRITE))
                queue_id = 0
                props.pop(Prop.DELAY, None)  # dead-lettered at once, not after the retry's delay
        # As SendMessageProcessor does: the broker's cluster name is added, and WAIT is not stored.
        props.pop(Prop.WAIT, None)
        props[Prop.CLUSTER] = self.broker.config.cluster_name
        return MessageInner(
            topic=topic, body=body, queue_id=queue_id, flag=req.flag, properties=props, sys_flag=req.sys_flag,
            born_timestamp=req.born_timestamp, born_host=parse_host(req.born_host),
            reconsume_times=req.reconsume_times,
        )  # fmt: skip

    def send_message(self, req: SendMessageRequest, body: bytes) -> SendMessageResponse:
        """SEND_MESSAGE (10/310). A PREPARED message becomes a hidden half message; DELAY parks it on the
        schedule topic (the store does that). May raise ``SendAckLost`` after storing (fault injection)."""
        self.broker.check_running()
        tc = self._topic_for_send(req)
        props = dict(req.properties)
        inner = self._inner(req, tc, body, props)
        prepared = req.sys_flag & SysFlag.TRANSACTION_MASK == SysFlag.TRANSACTION_PREPARED
        if prepared:
            inner = self.transactions.half_message(inner)
        result = self.broker.store.put_message(inner)
        raise_for_put(result)
        app = result.append_result
        assert app is not None
        code = _SEND_CODES[result.status]
        self.broker.faults.on_send_stored(req.topic, inner.queue_id, app.queue_offset)
        return SendMessageResponse(
            code,
            app.msg_id,
            req.queue_id if prepared or Prop.DELAY in props else inner.queue_id,
            app.queue_offset,
            props.get(Prop.UNIQ_KEY) if prepared else None,
        )

    def send_batch_message(
        self, req: SendMessageRequest, entries: Sequence[BatchEntry]
    ) -> SendMessageResponse:
        """SEND_BATCH_MESSAGE (320): all entries on one queue, consecutive offsets; msg ids comma-joined."""
        self.broker.check_running()
        if not entries:
            raise MessageIllegalError("the batch is empty")
        tc = self._topic_for_send(req)
        inners = []
        for e in entries:
            if Prop.DELAY in e.properties or e.properties.get(Prop.TRAN_MSG):
                raise MessageIllegalError("delayed or transactional messages cannot be batched")
            inners.append(self._inner(req, tc, e.body, dict(e.properties)))
            inners[-1].flag = e.flag
        queue_id = inners[0].queue_id
        for inner in inners:
            inner.queue_id = queue_id
        result = self.broker.store.put_messages(inners)
        raise_for_put(result)
        app = result.append_result
        assert app is not None
        self.broker.faults.on_send_stored(req.topic, queue_id, app.queue_offset)
        code = _SEND_CODES[result.status]
        return SendMessageResponse(code, ",".join(app.msg_ids), queue_id, app.queue_offset)

    def ensure_topic_for_delivery(self, topic: str, queue_id: int) -> None:
        """Delayed/retry deliveries go to topics that may have been created implicitly; make sure they
        exist."""
        if self.broker.topics.select(topic) is None and is_retry_topic(topic):
            sg = self.broker.groups.find(topic[len("%RETRY%") :])
            self.broker.topics.create_in_send_back(topic, sg.retry_queue_nums, int(Perm.READ_WRITE))
