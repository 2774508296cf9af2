"""Producer behaviour against an in-process broker: send modes, queue selection, retries, lost ACKs."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from broker_sim import Broker, Message, Producer, SendStatus
from broker_sim.client.selectors import LatencyFaultTolerance, TopicPublishInfo, select_by_hash
from broker_sim.clock import ManualClock
from broker_sim.common.errors import BrokerConfigError, InvalidMessageError, SendFailedError
from broker_sim.common.message import Prop, SendResult
from broker_sim.common.requests import BrokerData, QueueData, TopicRouteData
from broker_sim.faults import FaultKind

from .conftest import SMALL_STORE


def test_sync_send_round_robin_and_result_fields(broker: Broker) -> None:
    p = Producer(broker, "P")
    results = [p.send(Message("T", f"m{i}".encode(), keys=["k", f"id{i}"], tags="A")) for i in range(8)]
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert sorted(r.queue_id for r in results) == [0, 0, 1, 1, 2, 2, 3, 3]  # round-robin over 4 queues
    per_queue: dict[int, list[int]] = {}
    for r in results:
        per_queue.setdefault(r.queue_id, []).append(r.queue_offset)
    assert all(v == [0, 1] for v in per_queue.values())
    assert len({r.msg_id for r in results}) == 8 and len({r.offset_msg_id for r in results}) == 8
    stored = broker.view_message_by_id(results[3].offset_msg_id)
    assert stored.body == b"m3" and stored.uniq_key == results[3].msg_id
    assert stored.key_list == ["k", "id3"] and stored.tags == "A"
    assert [m.body for m in broker.query_message_by_key("T", "id5")] == [b"m5"]
    p.shutdown()


def test_unknown_topic_fails_unless_auto_create(broker: Broker, tmp_path: Path) -> None:
    p = Producer(broker, "P")
    with pytest.raises(SendFailedError):
        p.send(Message("Nope", b"x"))
    p.shutdown()
    auto = Broker(tmp_path / "auto", auto_create_topic_enable=True, **SMALL_STORE).start()
    try:
        p2 = Producer(auto, "P")
        r = p2.send(Message("Fresh", b"x"))
        assert r.status is SendStatus.SEND_OK
        tc = auto.topics.select("Fresh")
        assert tc is not None and tc.write_queue_nums == 4  # min(client's 4, TBW102's 8)
        p2.shutdown()
    finally:
        auto.shutdown()


def test_bad_messages_and_config_are_typed_errors(broker: Broker, tmp_path: Path) -> None:
    p = Producer(broker, "P")
    with pytest.raises(InvalidMessageError):
        p.send(Message("T", b""))
    with pytest.raises(InvalidMessageError):
        p.send(Message("bad topic!", b"x"))
    with pytest.raises(InvalidMessageError):
        Producer(broker, "P2", max_message_size=10).send(Message("T", b"x" * 11))
    with pytest.raises(BrokerConfigError):
        Broker(tmp_path / "x", no_such_option=1)
    with pytest.raises(ValueError):
        Producer(broker, "bad group!")
    p.shutdown()


def test_sharding_key_keeps_a_key_on_one_queue(broker: Broker) -> None:
    p = Producer(broker, "P")
    queues = {key: {p.send_orderly(Message("T", b"x"), key).queue_id for _ in range(5)} for key in "abcdefgh"}
    assert all(len(q) == 1 for q in queues.values())
    assert len({next(iter(q)) for q in queues.values()}) > 1
    p.shutdown()


def test_async_oneway_batch_and_compression(broker: Broker) -> None:
    p = Producer(broker, "P")
    done = threading.Event()
    got: list[SendResult] = []

    def on_success(result: SendResult) -> None:
        got.append(result)
        done.set()

    fut = p.send_async(Message("T", b"async"), on_success=on_success)
    assert done.wait(5) and fut.result(5) == got[0]
    p.send_oneway(Message("T", b"oneway", keys="ow"))
    batch = p.send_batch([Message("T", f"b{i}".encode(), keys=f"bk{i}") for i in range(5)])
    stored = broker.messages("T", batch.queue_id, batch.queue_offset, 5)
    assert [m.body for m in stored] == [b"b0", b"b1", b"b2", b"b3", b"b4"]
    assert batch.offset_msg_id.count(",") == 4
    big = p.send(Message("T", b"z" * 10_000))
    raw = broker.messages("T", big.queue_id, big.queue_offset, 1)[0]
    assert raw.sys_flag & 1 and len(raw.body) < 10_000  # stored deflated, as RocketMQ clients do
    with pytest.raises(InvalidMessageError):
        p.send_batch([Message("T", b"x", delay_time_level=2)])
    p.shutdown()


def test_lost_send_ack_spends_the_budget_and_fails_without_retry(broker: Broker) -> None:
    """DefaultMQProducerImpl.sendDefaultImpl (4.9.8): a reply that never comes spends the shared 3 s budget,
    so the send is not retried — the caller gets an error although the message is stored once. A duplicate
    appears only if the application resends (with the same UNIQ_KEY)."""
    p = Producer(broker, "P")
    broker.faults.lose_send_acks(1)
    msg = Message("T", b"once", keys="order-1")
    with pytest.raises(SendFailedError, match="call timeout"):
        p.send(msg)
    copies = broker.query_message_by_key("T", "order-1")
    assert len(copies) == 1 and copies[0].uniq_key == msg.properties[Prop.UNIQ_KEY]
    assert broker.faults.counts[FaultKind.LOST_SEND_ACK] == 1
    again = p.send(msg)  # the application's resend: same client id, new offset
    copies = broker.query_message_by_key("T", "order-1")
    assert len(copies) == 2 and {c.uniq_key for c in copies} == {again.msg_id}
    assert len({(c.queue_id, c.queue_offset) for c in copies}) == 2
    p.shutdown()


def test_latency_fault_tolerance_avoids_slow_brokers() -> None:
    clock = ManualClock()
    lft = LatencyFaultTolerance(clock.now_ms)
    route = TopicRouteData(
        [QueueData("a", 2, 2, 6), QueueData("b", 2, 2, 6)],
        [BrokerData("c", "a", {0: "1:1"}), BrokerData("c", "b", {0: "1:2"})],
    )
    info = TopicPublishInfo("T", route)
    lft.update("a", 1200, isolation=False)  # ≥ 1000 ms → isolated 60 s
    assert {lft.select(info, None).broker_name for _ in range(20)} == {"b"}
    clock.advance(61)
    assert {lft.select(info, None).broker_name for _ in range(20)} == {"a", "b"}
    lft.update("a", 0, isolation=True)
    lft.update("b", 0, isolation=True)
    assert lft.select(info, None).broker_name in {"a", "b"}  # all isolated: the one that recovers first


def test_hash_selector_is_stable() -> None:
    from broker_sim.common.message import MessageQueue

    mqs = [MessageQueue("T", "a", i) for i in range(4)]
    assert select_by_hash(mqs, Message("T", b"x"), "key-1") == select_by_hash(
        mqs, Message("T", b"y"), "key-1"
    )


def test_delayed_message_is_invisible_until_due(manual_broker: Broker, clock: ManualClock) -> None:
    from tests.waiting import wait_until

    p = Producer(manual_broker, "P")
    r = p.send(Message("T", b"later", delay_time_level=3))  # 10 s
    manual_broker.store.wait_dispatched()
    assert manual_broker.messages("T", r.queue_id) == []
    assert manual_broker.schedule_service is not None
    assert manual_broker.schedule_service.pending() == {3: 1}
    clock.advance(9)
    clock.advance(ms=999)
    clock.advance(ms=1)
    wait_until(lambda: len(manual_broker.messages("T", r.queue_id)) == 1, what="delayed delivery")
    got = manual_broker.messages("T", r.queue_id)[0]
    assert got.body == b"later" and Prop.DELAY not in got.properties
    assert got.store_timestamp - got.born_timestamp == 10_000
    manual_broker.shutdown()
    import json

    progress = json.loads((manual_broker.store.config_dir / "delayOffset.json").read_text())
    assert progress["offsetTable"]["3"] == 1


def test_delayed_messages_after_a_power_cut_are_delivered_though_the_schedule_queue_came_back_shorter(
    store_dir: Path, clock: ManualClock
) -> None:
    """ASYNC_FLUSH, nothing flushed: after the power cut the schedule queue is back at offset 0 while the
    saved delay progress says 3. New delayed messages (and retries, which go the same way) reuse offsets
    0 and 1: RocketMQ clamps the saved progress into the recovered queue (``correctDelayOffset``) and
    delivers them. Kept at 3, they were skipped for ever."""
    from tests.waiting import wait_until

    config = {"topics": {"T": 1}, "flush_interval_commit_log_ms": 3_600_000, **SMALL_STORE}

    def delayed(broker: Broker, broker_clock: ManualClock, bodies: list[bytes], then: int) -> None:
        """Send ``bodies`` 1 s delayed, let the delay pass, wait for ``then`` messages on the topic."""
        producer = Producer(broker, "P")
        for body in bodies:
            producer.send(Message("T", body, delay_time_level=1))
        broker.store.wait_dispatched()
        broker_clock.advance(2)
        wait_until(lambda: broker.get_max_offset("T", 0) == then, what="the delayed messages delivered")

    first = Broker(store_dir, clock=clock, **config).start()
    delayed(first, clock, [b"old-0", b"old-1", b"old-2"], 3)
    assert first.schedule_service is not None
    first.schedule_service.persist()  # as the periodic flush of delayOffset.json does
    first.faults.crash_broker(first)  # power cut: the commit log was never flushed

    later = ManualClock(clock.now_ms() + 1000)
    second = Broker(store_dir, clock=later, **config).start()
    try:
        assert second.store.get_max_offset_in_queue("SCHEDULE_TOPIC_XXXX", 0) == 0
        delayed(second, later, [b"new-0", b"new-1"], 2)
        assert [m.body for m in second.messages("T", 0)] == [b"new-0", b"new-1"]
    finally:
        second.shutdown()
