"""CONSUMER_SEND_MSG_BACK and the dead-letter topic as RocketMQ 4.9.8's
``SendMessageProcessor.asyncConsumerSendMsgBack`` does them."""

from __future__ import annotations

import pytest

from broker_sim import Broker, ManualClock, Message, Producer, PullConsumer
from broker_sim.client.send_back import retry_copy
from broker_sim.common.errors import InvalidMessageError
from broker_sim.common.message import MessageExt, Prop
from broker_sim.common.requests import ConsumerSendMsgBackRequest, Perm, PullStatus
from tests.waiting import wait_until


def _stored(broker: Broker, topic: str) -> list[MessageExt]:
    tc = broker.topics.select(topic)
    assert tc is not None
    return [m for q in range(tc.read_queue_nums) for m in broker.messages(topic, q)]


def test_origin_id_comes_from_the_stored_copy_not_the_request(
    manual_broker: Broker, clock: ManualClock
) -> None:
    """SendMessageProcessor (4.9.8): ORIGIN_MESSAGE_ID of a new copy = the looked-up message's
    ORIGIN_MESSAGE_ID, or its own id when blank; the request's originMsgId is not used for it. A client that
    names the retry copy as originMsgId must not make later copies point at that copy."""
    b = manual_broker
    Producer(b, "P").send(Message("T", b"poison", keys="k"))
    original = next(m for q in range(4) for m in b.messages("T", q))
    b.consumer_send_msg_back(ConsumerSendMsgBackRequest("G", original.commit_log_offset, 0))
    clock.advance(10)  # level 3 = 10 s, then the copy is restored onto %RETRY%G
    wait_until(lambda: len(_stored(b, "%RETRY%G")) == 1, what="the first retry copy")
    first = _stored(b, "%RETRY%G")
    assert first[0].properties[Prop.ORIGIN_MESSAGE_ID] == original.offset_msg_id  # blank → own id
    # The client names the *copy* as the origin; the broker keeps pointing at the original.
    b.consumer_send_msg_back(
        ConsumerSendMsgBackRequest("G", first[0].commit_log_offset, 0, origin_msg_id=first[0].offset_msg_id)
    )
    clock.advance(30)  # level 4
    wait_until(lambda: len(_stored(b, "%RETRY%G")) == 2, what="the second retry copy")
    second = _stored(b, "%RETRY%G")
    assert second[1].properties[Prop.ORIGIN_MESSAGE_ID] == original.offset_msg_id
    assert second[1].reconsume_times == 2 and second[1].properties[Prop.RETRY_TOPIC] == "T"


def test_dead_letter_topic_is_read_write_and_consumable(broker: Broker) -> None:
    """SendMessageProcessor (4.9.8) creates %DLQ%<group> with PERM_WRITE | PERM_READ and one queue, so a
    consumer can drain it (a write-only DLQ answers NO_PERMISSION to every pull)."""
    Producer(broker, "P").send(Message("T", b"dead", keys="d"))
    original = next(m for q in range(4) for m in broker.messages("T", q))
    broker.consumer_send_msg_back(ConsumerSendMsgBackRequest("G", original.commit_log_offset, -1))
    tc = broker.topics.select("%DLQ%G")
    assert tc is not None and tc.perm == int(Perm.READ_WRITE) and tc.read_queue_nums == 1
    pc = PullConsumer(broker, "dlq-drainer").start()
    (mq,) = pc.fetch_subscribe_message_queues("%DLQ%G")
    result = pc.pull(mq, "*", 0)
    assert result.status is PullStatus.FOUND
    assert [m.body for m in result.msgs] == [b"dead"]
    assert result.msgs[0].properties[Prop.ORIGIN_MESSAGE_ID] == original.offset_msg_id
    pc.shutdown()


def test_a_client_sent_retry_copy_counts_as_a_retry_and_dead_letters_at_the_maximum(
    manual_broker: Broker, clock: ManualClock
) -> None:
    """DefaultMQPushConsumerImpl.sendMessageBack (4.9.8), when the broker cannot take a message back: the
    client sends a copy to %RETRY%<group> itself, with the reconsume count plus one and the maximum as
    properties; its producer moves both into the request header (DefaultMQProducerImpl.sendKernelImpl),
    where the broker dead-letters a copy at the maximum (SendMessageProcessor.handleRetryAndDLQ)."""
    b = manual_broker
    Producer(b, "P").send(Message("T", b"poison", keys="k"))
    original = next(m for q in range(4) for m in b.messages("T", q))
    # what the group's heartbeat does (ClientManageProcessor.heartBeat)
    b.topics.create_in_send_back("%RETRY%G", 1, int(Perm.READ_WRITE))
    inner = Producer(b, "CLIENT_INNER_PRODUCER")
    inner.send(retry_copy(original, "G", max_reconsume_times=16))
    clock.advance(10)  # delay level 3 + reconsume times 0
    (copy,) = wait_until(lambda: _stored(b, "%RETRY%G"), what="the retry copy")
    assert copy.body == b"poison" and copy.reconsume_times == 1
    assert copy.properties[Prop.RETRY_TOPIC] == "T"
    assert copy.properties[Prop.ORIGIN_MESSAGE_ID] == original.msg_id
    assert copy.properties[Prop.KEYS] == "k"
    assert Prop.RECONSUME_TIME not in copy.properties and Prop.MAX_RECONSUME_TIMES not in copy.properties

    copy.topic = "T"  # as the listener saw it
    inner.send(retry_copy(copy, "G", max_reconsume_times=2))  # this copy would be its second reconsume
    (dead,) = wait_until(
        lambda: _stored(b, "%DLQ%G"), timeout=10, what="the copy at the maximum dead-lettered"
    )
    assert dead.body == b"poison" and dead.properties[Prop.ORIGIN_MESSAGE_ID] == original.msg_id
    assert len(_stored(b, "%RETRY%G")) == 1
    inner.shutdown()


def test_a_retry_copy_with_a_malformed_count_is_refused_before_it_is_sent(broker: Broker) -> None:
    broker.topics.create_in_send_back("%RETRY%G", 1, int(Perm.READ_WRITE))
    producer = Producer(broker, "P")
    with pytest.raises(InvalidMessageError, match="RECONSUME_TIME"):
        producer.send(Message("%RETRY%G", b"x", properties={Prop.RECONSUME_TIME: "many"}))
    assert _stored(broker, "%RETRY%G") == []
    producer.shutdown()
