"""Live rebalancing 1 → 2 → 3 consumers over 8 queues with each strategy, and the duplicates faults cause."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest

from broker_sim import (
    Broker,
    ConsumeFromWhere,
    ConsumeStatus,
    ManualClock,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)
from broker_sim.client.allocate import STRATEGIES
from broker_sim.faults import FaultKind
from tests.waiting import wait_until

from .conftest import SMALL_STORE


class Log:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, int, int]] = []

    def listener(self, name: str):  # type: ignore[no-untyped-def]
        def on(msgs: list[MessageExt]) -> ConsumeStatus:
            with self.lock:
                self.seen.extend((name, m.queue_id, m.queue_offset) for m in msgs)
            return ConsumeStatus.CONSUME_SUCCESS

        return on

    def counts(self) -> Counter[tuple[int, int]]:
        with self.lock:
            return Counter((q, o) for _, q, o in self.seen)


def produce(broker: Broker, topic: str, n: int) -> None:
    p = Producer(broker, "P")
    for i in range(n):
        p.send(Message(topic, f"{i}".encode()))
    p.shutdown()


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_rebalance_one_two_three_consumers(store_dir: Path, name: str) -> None:
    b = Broker(store_dir, topics={"R": 8}, **SMALL_STORE).start()
    alloc = STRATEGIES[name]
    log = Log()
    consumers: list[PushConsumer] = []
    try:
        produce(b, "R", 80)
        for k in range(3):
            c = PushConsumer(
                b, "G", allocate=alloc, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                instance_name=f"c{k}",
            )  # fmt: skip
            c.subscribe("R", "*", log.listener(f"c{k}")).start()
            consumers.append(c)
            cids = b.get_consumer_list_by_group("G")
            assert len(cids) == k + 1
            queues = [MessageQueue("R", "broker-a", i) for i in range(8)]

            def settled(queues: list[MessageQueue] = queues, cids: list[str] = cids) -> bool:
                return all(
                    [q for q in c.assigned_queues() if q.topic == "R"]
                    == alloc("G", c.client_id, queues, cids)
                    for c in consumers
                )

            wait_until(settled, what=f"{k + 1} consumers to settle on {name}")
            owned = sorted(q for c in consumers for q in c.assigned_queues() if q.topic == "R")
            assert owned == queues  # every queue has exactly one owner
            produce(b, "R", 40)
        wait_until(lambda: len(log.counts()) == 80 + 3 * 40, what="every message")  # nothing lost
    finally:
        for c in consumers:
            c.shutdown()
        b.shutdown()


def test_rebalance_mid_consume_redelivers_from_the_committed_offset(broker: Broker) -> None:
    """A queue taken away while its listener is stuck: the old owner's result is dropped, the new owner
    starts from the committed (stalled) offset and consumes the later messages a second time."""
    release = threading.Event()
    stuck = threading.Event()
    log = Log()
    q0 = MessageQueue("T", "broker-a", 0)
    p = Producer(broker, "P")
    p.send_batch([Message("T", f"{i}".encode()) for i in range(10)], queue=q0)
    broker.store.wait_dispatched()

    def slow(msgs: list[MessageExt]) -> ConsumeStatus:
        if msgs[0].queue_id == 0 and msgs[0].queue_offset == 3:
            stuck.set()
            release.wait(30)
        return log.listener("c1")(msgs)  # type: ignore[no-any-return]

    c1 = PushConsumer(broker, "G", instance_name="z1").subscribe("T", "*", slow).start()
    try:
        wait_until(lambda: stuck.is_set() and len(log.counts()) == 9, what="c1 stuck at 3 with the rest done")
        c2 = PushConsumer(broker, "G", instance_name="a2").subscribe("T", "*", log.listener("c2")).start()
        wait_until(
            lambda: q0 not in c1.assigned_queues() and q0 in c2.assigned_queues(), what="q0 to move to c2"
        )
        wait_until(lambda: log.counts()[(0, 9)] == 2, what="c2 to redeliver up to offset 9")
        release.set()
        wait_until(
            lambda: c1.consume_service is not None and c1.consume_service.consumed >= 9, what="c1 to finish"
        )
        redelivered = sorted(o for n, q, o in log.seen if n == "c2" and q == 0)
        assert redelivered == list(range(3, 10))
        c2.persist_offsets()
        assert broker.query_consumer_offset("G", "T", 0) == 10
        c2.shutdown()
    finally:
        release.set()
        c1.shutdown()
        p.shutdown()


def test_forced_rebalance_is_logged_and_counted(broker: Broker) -> None:
    log = Log()
    c = PushConsumer(broker, "G").subscribe("T", "*", log.listener("c")).start()
    before = c.rebalance_count
    broker.faults.force_rebalance(c)
    assert c.rebalance_count >= before + 1  # (the join notification may add its own)
    assert len(c.assigned_queues()) == 5
    assert broker.faults.counts[FaultKind.FORCED_REBALANCE] == 1
    c.shutdown()


def test_lost_offset_commits_cause_redelivery_after_restart(broker: Broker) -> None:
    produce(broker, "T", 40)
    broker.store.wait_dispatched()
    broker.faults.lose_offset_commits(10_000, group="G")
    first = Log()
    c1 = PushConsumer(broker, "G").subscribe("T", "*", first.listener("c1")).start()
    wait_until(lambda: len(first.counts()) == 40, what="first pass")
    c1.shutdown()  # its final commit is lost too
    assert broker.faults.counts[FaultKind.LOST_OFFSET_COMMIT] > 0
    assert all(broker.offsets.query_offset("G", "T", q) == -1 for q in range(4))
    broker.faults.clear_rules()
    second = Log()
    c2 = PushConsumer(broker, "G").subscribe("T", "*", second.listener("c2")).start()
    wait_until(lambda: len(second.counts()) == 40, what="everything again")
    c2.shutdown()


def test_delayed_queue_looks_empty_until_the_delay_passes(manual_broker: Broker, clock: ManualClock) -> None:
    log = Log()
    q1 = MessageQueue("T", "broker-a", 1)
    manual_broker.faults.delay_queue("T", 1, 30_000)
    p = Producer(manual_broker, "P")
    for _ in range(3):
        p.send(Message("T", b"x"), queue=q1)
    p.send(Message("T", b"y"), queue=MessageQueue("T", "broker-a", 2))
    c = PushConsumer(manual_broker, "G").subscribe("T", "*", log.listener("c")).start()
    wait_until(lambda: log.counts()[(2, 0)] == 1, what="the undelayed queue")
    assert not any(q == 1 for q, _ in log.counts())
    clock.advance(31)
    wait_until(lambda: sum(1 for q, _ in log.counts() if q == 1) == 3, what="the delayed queue after 30 s")
    assert manual_broker.faults.counts[FaultKind.QUEUE_DELAYED] == 1
    c.shutdown()
    p.shutdown()


@pytest.mark.parametrize(("flush", "survive"), [("ASYNC_FLUSH", False), ("SYNC_FLUSH", True)])
def test_broker_crash_loses_unflushed_messages_only_under_async_flush(
    tmp_path: Path, flush: str, survive: bool
) -> None:
    clock = ManualClock()  # the async flusher never runs: everything acknowledged is still unflushed
    kw = dict(SMALL_STORE, topics={"T": 4}, clock=clock, flush_disk_type=flush)
    b = Broker(tmp_path / "s", **kw).start()
    p = Producer(b, "P")
    for i in range(10):
        p.send(Message("T", f"{i}".encode(), keys=f"k{i}"))
    p.shutdown()
    b.faults.crash_broker(b)
    assert b.faults.counts[FaultKind.BROKER_CRASHED] == 1
    b2 = Broker(tmp_path / "s", **kw).start()
    try:
        stored = sum(len(b2.messages("T", q)) for q in range(4))
        assert stored == (10 if survive else 0)
    finally:
        b2.shutdown()
