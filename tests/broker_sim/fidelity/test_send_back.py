"""CONSUMER_SEND_MSG_BACK and the dead-letter topic as RocketMQ 4.9.8's
``SendMessageProcessor.asyncConsumerSendMsgBack`` does them."""

from __future__ import annotations

from broker_sim import Broker, ManualClock, Message, Producer, PullConsumer
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
