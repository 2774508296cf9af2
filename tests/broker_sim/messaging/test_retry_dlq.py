"""RECONSUME_LATER → %RETRY% on the 10 s, 30 s, 1 m … 2 h schedule (driven by a ManualClock) → %DLQ%
after 16."""

from __future__ import annotations

import threading
from functools import partial

from broker_sim import (
    Broker,
    ConsumeStatus,
    ManualClock,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PushConsumer,
)
from broker_sim.common.constants import parse_delay_levels
from broker_sim.common.message import Prop
from tests.waiting import wait_until

LEVELS = parse_delay_levels()


def test_full_retry_schedule_then_dead_letter(manual_broker: Broker, clock: ManualClock) -> None:
    b = manual_broker
    deliveries: list[tuple[int, MessageExt]] = []
    lock = threading.Lock()

    def always_fail(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            deliveries.extend((clock.now_ms(), m) for m in msgs)
        return ConsumeStatus.RECONSUME_LATER

    p = Producer(b, "P")
    sent = p.send(Message("T", b"poison", keys="order-42", tags="A"))
    c = PushConsumer(b, "G").subscribe("T", "*", always_fail).start()
    schedule = b.schedule_service
    assert schedule is not None

    def parked_at(level: int) -> bool:
        return schedule.pending() == {level: 1}

    def delivered(n: int) -> bool:
        return len(deliveries) == n

    wait_until(lambda: len(deliveries) == 1, what="first delivery")
    for attempt in range(16):
        level = 3 + attempt
        wait_until(partial(parked_at, level), what=f"send-back at level {level}")
        failed_at = deliveries[-1][0]
        clock.advance(ms=LEVELS[level - 1])
        wait_until(partial(delivered, attempt + 2), what=f"retry {attempt + 1}")
        at, msg = deliveries[-1]
        assert msg.reconsume_times == attempt + 1
        assert (
            msg.topic == "T" and msg.properties[Prop.RETRY_TOPIC] == "T"
        )  # the listener sees the real topic
        assert msg.msg_id == sent.msg_id and msg.body == b"poison" and msg.tags == "A"
        assert msg.properties[Prop.ORIGIN_MESSAGE_ID]
        assert msg.store_timestamp - failed_at == LEVELS[level - 1]
        assert at - failed_at == LEVELS[level - 1]
    gaps = [deliveries[i + 1][0] - deliveries[i][0] for i in range(16)]
    assert gaps[:4] == [10_000, 30_000, 60_000, 120_000] and gaps[-2:] == [3_600_000, 7_200_000]
    # The 17th failure (reconsume times 16 = the maximum) goes to the dead-letter queue, not to %RETRY%.
    wait_until(lambda: len(b.dlq_messages("G")) == 1, what="the DLQ copy")
    dead = b.dlq_messages("G")[0]
    assert dead.topic == "%DLQ%G" and dead.uniq_key == sent.msg_id and dead.reconsume_times == 17
    assert dead.properties[Prop.RETRY_TOPIC] == "T"
    assert schedule.pending() == {}
    clock.advance(3 * 3600)
    assert len(deliveries) == 17  # nothing more comes back
    tc = b.topics.select("%DLQ%G")
    assert tc is not None and tc.readable and tc.writable  # 4.9.8 creates %DLQ% read-write
    c.shutdown()
    p.shutdown()


def test_negative_delay_level_dead_letters_at_once_and_group_max_applies(broker: Broker) -> None:
    p = Producer(broker, "P")
    r = p.send(Message("T", b"bad"))
    broker.store.wait_dispatched()
    pc = PullConsumer(broker, "PG", max_reconsume_times=2).start()
    mq = next(q for q in pc.fetch_subscribe_message_queues("T") if q.queue_id == r.queue_id)
    msg = pc.pull(mq, "*", r.queue_offset, 1).msgs[0]
    pc.send_message_back(msg, -1)
    dead = broker.dlq_messages("PG")
    assert len(dead) == 1 and dead[0].body == b"bad" and dead[0].reconsume_times == 1
    # With max 2: reconsume times 0 and 1 go to %RETRY%, 2 goes to the DLQ.
    pc.send_message_back(msg, 0)
    retry = broker.retry_messages("PG")
    assert broker.schedule_service is not None and broker.schedule_service.pending() == {3: 1}
    assert retry == []  # still parked on the schedule topic (10 s)
    msg.reconsume_times = 2
    msg_at_max = msg
    pc.send_message_back(msg_at_max, 0)  # the broker reads the *stored* reconsume times (0) ...
    assert len(broker.dlq_messages("PG")) == 1  # ... so this one is a retry, not a dead letter
    pc.shutdown()
    p.shutdown()


def test_listener_exception_means_reconsume_later(manual_broker: Broker, clock: ManualClock) -> None:
    calls: list[int] = []

    def boom(msgs: list[MessageExt]) -> ConsumeStatus:
        calls.append(msgs[0].reconsume_times)
        if msgs[0].reconsume_times == 0:
            raise RuntimeError("downstream down")
        return ConsumeStatus.CONSUME_SUCCESS

    p = Producer(manual_broker, "P")
    p.send(Message("T", b"x"))
    c = PushConsumer(manual_broker, "G").subscribe("T", "*", boom).start()
    wait_until(lambda: manual_broker.schedule_service.pending() == {3: 1}, what="send-back")  # type: ignore[union-attr]
    clock.advance(10)
    wait_until(lambda: calls == [0, 1], what="the retry")
    c.shutdown()
    p.shutdown()
