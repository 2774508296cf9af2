"""Handing a message the listener failed on back for redelivery (RocketMQ 4.9.8
``DefaultMQPushConsumerImpl.sendMessageBack``).

First CONSUMER_SEND_MSG_BACK to the master of the broker group the message came from: that broker stores a
copy on ``%RETRY%{group}`` (or ``%DLQ%{group}`` past the maximum) with the delay its level names. When that
fails — typically the master is down and the group is read from its slave — the client sends the copy
itself, as a plain message to ``%RETRY%{group}``, through the client's own producer. It lands on whichever
master takes it, so the failed message leaves the queue it came from and that queue's offset can move on
while the master is away. The copy carries what the broker would have added: the original topic
(``RETRY_TOPIC``), the original id (``ORIGIN_MESSAGE_ID``), the reconsume count plus one and the maximum
(``RECONSUME_TIME``/``MAX_RECONSUME_TIMES``, which the producer moves into the request header so the
receiving broker dead-letters it past the maximum), and delay level ``3 + reconsume times``.

The push consumer retries a message in memory after 5 s only when both fail (Java's
``submitConsumeRequestLater``); the pull consumer's caller gets the error. Both consumers do this, as
``DefaultMQPushConsumerImpl`` and ``DefaultMQPullConsumerImpl`` do.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from broker_sim.client.producer import Producer
from broker_sim.clock import Clock
from broker_sim.common.constants import INNER_PRODUCER_GROUP, RETRY_GROUP_TOPIC_PREFIX
from broker_sim.common.errors import BrokerResponseError, ClientError
from broker_sim.common.message import Message, MessageExt, Prop
from broker_sim.common.requests import ConsumerSendMsgBackRequest
from broker_sim.common.transport import BrokerTransport, TransportFactory

log = logging.getLogger(__name__)

#: the delay level of a client-sent retry copy is this plus the message's reconsume count (as in Java)
CLIENT_RETRY_BASE_LEVEL = 3


class InnerProducer:
    """The client's own producer (``MQClientInstance``'s ``CLIENT_INNER_PRODUCER``), started on first use and
    shut down with its consumer. It connects the way the consumer was told to (a broker or a name server
    address); a consumer built on a ready transport has none, since closing that transport is its caller's."""

    def __init__(self, broker_or_address: object, clock: Clock) -> None:
        ready = isinstance(broker_or_address, BrokerTransport) and not isinstance(
            broker_or_address, str | TransportFactory
        )  # the order transport_for tells them apart in
        self._target = None if ready else broker_or_address
        self._clock = clock
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        self._closed = False

    def get(self) -> Producer | None:
        if self._target is None:
            return None
        with self._lock:
            if self._closed:
                return None
            if self._producer is None:
                self._producer = Producer(self._target, INNER_PRODUCER_GROUP, clock=self._clock)
            return self._producer

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.shutdown()


class SendBackHost(Protocol):
    """What sending a message back for redelivery needs of the consumer."""

    group: str
    transport: BrokerTransport
    max_reconsume_times: int
    inner_producer: InnerProducer


def send_back_request(
    msg: MessageExt, group: str, delay_level: int, max_reconsume_times: int
) -> ConsumerSendMsgBackRequest:
    return ConsumerSendMsgBackRequest(
        group=group,
        offset=msg.commit_log_offset,
        delay_level=delay_level,
        origin_msg_id=msg.msg_id,
        origin_topic=msg.topic,
        max_reconsume_times=max_reconsume_times,
        broker_name=msg.broker_name or "",
    )


def retry_copy(msg: MessageExt, group: str, max_reconsume_times: int) -> Message:
    """The copy of ``msg`` a client sends to ``%RETRY%{group}`` itself when its broker could not take it."""
    props = dict(msg.properties)
    props.setdefault(Prop.ORIGIN_MESSAGE_ID, msg.msg_id)
    props[Prop.RETRY_TOPIC] = msg.topic
    props[Prop.RECONSUME_TIME] = str(msg.reconsume_times + 1)
    props[Prop.MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    props.pop(Prop.TRAN_MSG, None)
    props.pop(Prop.DELAY, None)
    return Message(
        RETRY_GROUP_TOPIC_PREFIX + group,
        bytes(msg.body),
        flag=msg.flag,
        properties=props,
        delay_time_level=CLIENT_RETRY_BASE_LEVEL + msg.reconsume_times,
    )


def send_back(consumer: SendBackHost, msg: MessageExt, delay_level: int) -> None:
    """Send ``msg`` back through its broker, else as a retry copy through the client's producer; raises the
    copy's send error when neither took it (or the first error when the consumer has no producer)."""
    try:
        consumer.transport.consumer_send_msg_back(
            send_back_request(msg, consumer.group, delay_level, consumer.max_reconsume_times)
        )
        return
    except (ClientError, BrokerResponseError) as exc:
        log.warning("send back of %s for %s failed: %s", msg.msg_id, consumer.group, exc)
        producer = consumer.inner_producer.get()
        if producer is None:
            raise
    result = producer.send(retry_copy(msg, consumer.group, consumer.max_reconsume_times))
    log.info(
        "%s: %s sent as a retry copy to %s (%s queue %d)",
        consumer.group,
        msg.msg_id,
        result.topic,
        result.broker_name,
        result.queue_id,
    )


def try_send_back(consumer: SendBackHost, msg: MessageExt, delay_level: int) -> bool:
    """:func:`send_back`; False when neither way took the message (the caller then retries it locally)."""
    try:
        send_back(consumer, msg, delay_level)
    except (ClientError, BrokerResponseError) as exc:
        log.warning("%s: %s not sent back: %s; retrying locally", consumer.group, msg.msg_id, exc)
        return False
    return True
