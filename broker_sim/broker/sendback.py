"""CONSUMER_SEND_MSG_BACK: the broker half of retries and dead letters (RocketMQ's
``SendMessageProcessor.consumerSendMsgBack``), and the mapping of store put statuses to reply errors."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker_sim.common.constants import SendBackTarget, dlq_topic, retry_topic, send_back_decision
from broker_sim.common.errors import (
    BrokerResponseError,
    MessageIllegalError,
    ServiceNotAvailableError,
    SystemBusyError,
)
from broker_sim.common.message import Prop
from broker_sim.common.requests import ConsumerSendMsgBackRequest, Perm
from broker_sim.store.message_record import MessageInner
from broker_sim.store.results import PutMessageResult, PutMessageStatus

if TYPE_CHECKING:
    from broker_sim.broker.clients import SubscriptionGroupManager
    from broker_sim.broker.topics import TopicConfigManager
    from broker_sim.store.message_store import MessageStore

log = logging.getLogger("broker_sim.broker")


def raise_for_put(result: PutMessageResult) -> None:
    status = result.status
    if result.ok:
        return
    if status is PutMessageStatus.SERVICE_NOT_AVAILABLE:
        raise ServiceNotAvailableError(f"service not available now: {result.remark}")
    if status in (PutMessageStatus.MESSAGE_ILLEGAL, PutMessageStatus.PROPERTIES_SIZE_EXCEEDED):
        raise MessageIllegalError(f"the message is illegal: {result.remark or status.value}")
    if status is PutMessageStatus.OS_PAGECACHE_BUSY:
        raise SystemBusyError("[PC_SYNCHRONIZED]broker busy, start flow control for a while")
    raise BrokerResponseError(f"put message failed: {status.value} {result.remark}")


class SendBackService:
    """CONSUMER_SEND_MSG_BACK; the Broker owns one (``broker.send_back``)."""

    def __init__(
        self,
        store: MessageStore,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        check_running: Callable[[], None],
    ) -> None:
        self.store = store
        self.topics = topics
        self.groups = groups
        self.check_running = check_running

    def consumer_send_msg_back(self, req: ConsumerSendMsgBackRequest) -> None:
        """CONSUMER_SEND_MSG_BACK (36): store a copy of the failed message on ``%RETRY%{group}`` at delay
        level ``3 + reconsumeTimes`` (or the client's level), or on ``%DLQ%{group}`` past the maximum / for
        level < 0. The copy keeps the UNIQ_KEY and records RETRY_TOPIC (original topic) and
        ORIGIN_MESSAGE_ID (as ``SendMessageProcessor.asyncConsumerSendMsgBack`` in 4.9.8)."""
        self.check_running()
        sg = self.groups.find(req.group)
        msg = self.store.look_message_by_offset(req.offset)
        if msg is None:
            raise BrokerResponseError(f"look message by offset failed, {req.offset}")
        props = dict(msg.properties)
        props.setdefault(Prop.RETRY_TOPIC, msg.topic)
        props[Prop.WAIT] = "false"  # Java: msgExt.setWaitStoreMsgOK(false) before copying its properties
        limit = req.max_reconsume_times if req.max_reconsume_times is not None else sg.retry_max_times
        decision = send_back_decision(msg.reconsume_times, req.delay_level, limit)
        if decision.target is SendBackTarget.DLQ:
            topic, queue_id = dlq_topic(req.group), 0
            # 4.9.2+ creates %DLQ% read-write (a consumer may drain it); 4.9.0/4.9.1 made it write-only.
            self.topics.create_in_send_back(topic, 1, int(Perm.READ_WRITE))
            props[Prop.DELAY] = "0"
        else:
            topic = retry_topic(req.group)
            tc = self.topics.create_in_send_back(topic, sg.retry_queue_nums, int(Perm.READ_WRITE))
            queue_id = random.randrange(tc.write_queue_nums)
            props[Prop.DELAY] = str(decision.delay_level)
        # The stored copy's ORIGIN_MESSAGE_ID wins; blank → the stored copy's own (offset) id. The request's
        # originMsgId is only used by consume hooks in Java, never for the new copy.
        origin = props.get(Prop.ORIGIN_MESSAGE_ID) or msg.msg_id
        props[Prop.ORIGIN_MESSAGE_ID] = origin
        inner = MessageInner(
            topic=topic, body=msg.body, queue_id=queue_id, flag=msg.flag, properties=props,
            sys_flag=msg.sys_flag,
            born_timestamp=msg.born_timestamp, born_host=msg.born_host, store_host=msg.store_host,
            reconsume_times=msg.reconsume_times + 1,
        )  # fmt: skip
        raise_for_put(self.store.put_message(inner))
        if decision.target is SendBackTarget.DLQ:
            log.warning(
                "message %s of %s moved to %s after %d attempts",
                origin,
                req.group,
                topic,
                msg.reconsume_times,
            )
