"""The transaction check-back a producer receives, as RocketMQ 4.9.8's
``AbstractTransactionalMessageCheckListener.sendCheckMessage`` builds it."""

from __future__ import annotations

from broker_sim import Broker, LocalTransactionState, ManualClock, Message, MessageExt, TransactionProducer
from tests.waiting import wait_until


def test_check_back_message_is_on_its_real_topic_and_queue(manual_broker: Broker, clock: ManualClock) -> None:
    """sendCheckMessage sets the message's topic to REAL_TOPIC and its queue to REAL_QID before encoding the
    body: the checker sees "T", not RMQ_SYS_TRANS_HALF_TOPIC."""
    checked: list[MessageExt] = []

    def checker(msg: MessageExt) -> LocalTransactionState:
        checked.append(msg)
        return LocalTransactionState.COMMIT_MESSAGE

    tp = TransactionProducer(
        manual_broker, "TP", executor=lambda m, arg: LocalTransactionState.UNKNOW, checker=checker
    )
    result = tp.send_message_in_transaction(Message("T", b"pending", keys="tx-1"))
    half = "RMQ_SYS_TRANS_HALF_TOPIC"
    wait_until(lambda: manual_broker.get_max_offset(half, 0) == 1, what="the half message indexed")
    clock.advance(60)  # the next check round finds it older than the 6 s transaction timeout
    wait_until(lambda: bool(checked), what="the check-back")
    msg = checked[0]
    assert msg.topic == "T" and msg.queue_id == result.queue_id
    assert msg.body == b"pending" and msg.uniq_key == result.msg_id
    tp.shutdown()
