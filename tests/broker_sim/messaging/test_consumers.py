"""Push and pull consumers: clustering, tags, batches, start policies, broadcasting, flow control."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import pytest

from broker_sim import (
    Broker,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    MessageModel,
    Producer,
    PullConsumer,
    PushConsumer,
)
from broker_sim.common.errors import ClientStateError
from broker_sim.common.requests import PullStatus
from tests.waiting import wait_until

from .conftest import SMALL_STORE


class Collector:
    """A listener that records every delivery (thread-safe)."""

    def __init__(self, status: ConsumeStatus = ConsumeStatus.CONSUME_SUCCESS) -> None:
        self.lock = threading.Lock()
        self.msgs: list[MessageExt] = []
        self.batches: list[int] = []
        self.status = status

    def __call__(self, msgs: list[MessageExt]) -> ConsumeStatus:
        with self.lock:
            self.msgs.extend(msgs)
            self.batches.append(len(msgs))
        return self.status

    def bodies(self) -> Counter[bytes]:
        with self.lock:
            return Counter(m.body for m in self.msgs)

    def count(self) -> int:
        with self.lock:
            return len(self.msgs)


def produce(
    broker: Broker, n: int, topic: str = "T", tags: str | None = None, prefix: str = "m"
) -> list[bytes]:
    p = Producer(broker, "P")
    bodies = [f"{prefix}{i}".encode() for i in range(n)]
    for b in bodies:
        p.send(Message(topic, b, keys=b.decode(), tags=tags))
    p.shutdown()
    broker.store.wait_dispatched()  # consume queues are built asynchronously, as in RocketMQ
    return bodies


def test_clustering_consumes_everything_once_and_commits(broker: Broker) -> None:
    bodies = produce(broker, 200)
    col = Collector()
    c = PushConsumer(broker, "G", consume_message_batch_max_size=4).subscribe("T", "*", col).start()
    wait_until(lambda: col.count() >= 200, what="200 messages")
    assert col.bodies() == Counter(bodies)
    assert max(col.batches) <= 4 and max(col.batches) > 1
    assert {m.topic for m in col.msgs} == {"T"}
    c.shutdown()
    broker.persist_all()  # the broker writes its offset table every 5 s; do it now
    offsets = json.loads((broker.store.config_dir / "consumerOffset.json").read_text())["offsetTable"]
    assert offsets["T@G"] == {str(q): 50 for q in range(4)}  # persisted at shutdown, 200 / 4 queues
    assert broker.consumer_progress("G", "T")[0].lag == 0


def test_tag_subscription_filters_on_broker_and_client(broker: Broker) -> None:
    produce(broker, 10, tags="A", prefix="a")
    produce(broker, 10, tags="B", prefix="b")
    produce(broker, 10, tags="C", prefix="c")
    col = Collector()
    c = PushConsumer(broker, "G").subscribe("T", "A || C", col).start()
    wait_until(lambda: col.count() >= 20, what="A and C messages")
    c.shutdown()
    assert {m.tags for m in col.msgs} == {"A", "C"} and col.count() == 20


def test_consume_from_policies_for_a_new_group(store_dir: Path) -> None:
    b = Broker(store_dir, topics={"T": 2}, query_offset_zero_for_new_group=False, **SMALL_STORE).start()
    try:
        old = produce(b, 10, prefix="old")
        first, last = Collector(), Collector()
        c1 = PushConsumer(b, "first", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        c1.subscribe("T", "*", first).start()
        c2 = PushConsumer(b, "last", consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET)
        c2.subscribe("T", "*", last).start()
        wait_until(lambda: len(c2.assigned_queues()) == 3, what="assignment")  # 2 queues + %RETRY%
        new = produce(b, 4, prefix="new")
        wait_until(lambda: first.count() >= 14 and last.count() >= 4, what="deliveries")
        assert first.bodies() == Counter(old + new)
        assert last.bodies() == Counter(new)
        c1.shutdown()
        c2.shutdown()
    finally:
        b.shutdown()


def test_new_group_reads_young_topic_from_zero_like_java(broker: Broker) -> None:
    produce(broker, 8)
    col = Collector()
    c = PushConsumer(broker, "G", consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET)
    c.subscribe("T", "*", col).start()
    wait_until(lambda: col.count() >= 8, what="all 8 (G13: offset 0 while min offset is 0)")
    c.shutdown()


def test_consume_from_timestamp(store_dir: Path) -> None:
    from broker_sim import ManualClock

    clock = ManualClock()
    b = Broker(
        store_dir, topics={"T": 1}, clock=clock, query_offset_zero_for_new_group=False, **SMALL_STORE
    ).start()
    try:
        produce(b, 3, prefix="early")
        clock.advance(60)
        cut = clock.now_ms()
        late = produce(b, 3, prefix="late")
        col = Collector()
        c = PushConsumer(
            b, "G", consume_from_where=ConsumeFromWhere.CONSUME_FROM_TIMESTAMP, consume_timestamp_ms=cut
        ).subscribe("T", "*", col)
        c.start()
        wait_until(lambda: col.count() >= 3, what="late messages")
        assert col.bodies() == Counter(late)
        c.shutdown()
    finally:
        b.shutdown()


def test_pull_consumer_reads_a_queue_and_keeps_offsets(broker: Broker) -> None:
    produce(broker, 40)
    pc = PullConsumer(broker, "PG").start()
    mqs = pc.fetch_subscribe_message_queues("T")
    assert len(mqs) == 4
    mq = mqs[0]
    r = pc.pull(mq, "*", 0, 4)
    assert r.status is PullStatus.FOUND and [m.queue_offset for m in r.msgs] == [0, 1, 2, 3]
    assert r.next_begin_offset == 4 and r.max_offset == 10
    end = pc.pull(mq, "*", 10, 32)
    assert end.status is PullStatus.NO_NEW_MSG and end.next_begin_offset == 10
    assert pc.pull(mq, "*", 99, 32).status is PullStatus.OFFSET_ILLEGAL
    pc.update_consume_offset(mq, 4)
    pc.shutdown()
    pc2 = PullConsumer(broker, "PG").start()
    assert pc2.fetch_consume_offset(mq) == 4
    with pytest.raises(ValueError):
        pc2.pull(mq, "*", -1)
    pc2.shutdown()
    with pytest.raises(ClientStateError):
        pc2.pull(mq, "*", 0)


def test_pull_block_if_not_found_is_woken_by_a_new_message(broker: Broker) -> None:
    pc = PullConsumer(broker, "PG").start()
    mq = pc.fetch_subscribe_message_queues("T")[2]
    box: list[object] = []
    t = threading.Thread(
        target=lambda: box.append(pc.pull_block_if_not_found(mq, "*", 0, 32, timeout_ms=10_000))
    )
    t.start()
    wait_until(lambda: broker.pull_processor.held_count >= 1, what="the pull to be held")
    p = Producer(broker, "P")
    p.send(Message("T", b"wake"), queue=mq)
    t.join(5)
    assert not t.is_alive()
    r = box[0]
    assert r.status is PullStatus.FOUND and r.msgs[0].body == b"wake"  # type: ignore[attr-defined]
    p.shutdown()
    pc.shutdown()


def test_broadcasting_delivers_to_every_consumer_with_local_offsets(broker: Broker, tmp_path: Path) -> None:
    # (A new broadcasting consumer has no local offsets; with CONSUME_FROM_LAST it would skip the backlog,
    # exactly as RocketMQ does, so this one starts from the first offset.)
    bodies = produce(broker, 30)
    cols = [Collector() for _ in range(3)]
    consumers = [
        PushConsumer(
            broker, "BG", message_model=MessageModel.BROADCASTING, local_offset_dir=tmp_path / "offsets",
            instance_name=f"inst{i}", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        ).subscribe("T", "*", col).start()
        for i, col in enumerate(cols)
    ]  # fmt: skip
    for col in cols:
        wait_until(lambda col=col: col.count() >= 30, what="every consumer gets every message")  # type: ignore[misc]
        assert col.bodies() == Counter(bodies)
    for c in consumers:
        c.shutdown()
    for i in range(3):
        path = next((tmp_path / "offsets").glob(f"*inst{i}/BG/offsets.json"))
        table = json.loads(path.read_text())["offsetTable"]
        assert sorted((e["queueId"], e["offset"]) for e in table) == [
            (q, broker.get_max_offset("T", q)) for q in range(4)
        ]
    broker.persist_all()
    assert (
        "T@BG" not in json.loads((broker.store.config_dir / "consumerOffset.json").read_text())["offsetTable"]
    )
    # A restarted broadcasting consumer resumes from its local file: nothing is delivered again.
    again = Collector()
    c = (
        PushConsumer(
            broker,
            "BG",
            message_model=MessageModel.BROADCASTING,
            local_offset_dir=tmp_path / "offsets",
            instance_name="inst0",
        )
        .subscribe("T", "*", again)
        .start()
    )
    produce(broker, 1, prefix="fresh")
    wait_until(lambda: again.count() >= 1, what="the fresh message")
    assert again.bodies() == Counter([b"fresh0"])
    c.shutdown()


def test_flow_control_engages_when_too_many_messages_are_in_flight(broker: Broker) -> None:
    release = threading.Event()
    seen = Collector()

    def slow(msgs: list[MessageExt]) -> ConsumeStatus:
        seen(msgs)
        release.wait(20)
        return ConsumeStatus.CONSUME_SUCCESS

    produce(broker, 120)
    c = PushConsumer(broker, "G", consume_threads=2, pull_threshold_for_queue=5, pull_batch_size=8)
    c.subscribe("T", "*", slow).start()
    wait_until(lambda: c.flow_control_times > 0, what="flow control")
    in_flight = sum(pq.msg_count for pq in c.process_queues.values())
    assert in_flight <= 4 * (5 + 8)  # per queue: threshold + one pull batch at most
    release.set()
    wait_until(lambda: seen.count() >= 120, what="the backlog to drain")
    c.shutdown()


def test_span_flow_control(broker: Broker) -> None:
    stall = threading.Event()
    col = Collector()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        if msgs[0].queue_offset == 0 and msgs[0].queue_id == 0:
            stall.wait(20)
        return col(msgs)

    p = Producer(broker, "P")
    from broker_sim import MessageQueue

    q0 = MessageQueue("T", "broker-a", 0)
    p.send_batch([Message("T", b"x") for _ in range(64)], queue=q0)
    c = (
        PushConsumer(broker, "G", consume_concurrently_max_span=20, pull_batch_size=16)
        .subscribe("T", "*", listener)
        .start()
    )
    wait_until(lambda: c.flow_control_times > 0, what="span flow control")
    pq = c.process_queues[q0]
    # The stalled offset 0 pins the commit offset, and pulling stopped once the span passed 20: nothing beyond
    # span + one pull batch was fetched although 64 messages are there.
    assert pq.committable_offset() == 0
    assert pq.queue_offset_max <= 20 + 16
    assert col.count() <= 36
    stall.set()
    wait_until(lambda: col.count() >= 64, what="drain")
    c.shutdown()
    p.shutdown()
