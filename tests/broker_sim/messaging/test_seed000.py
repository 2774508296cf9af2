"""Seed 000 §2.3/§2.4: one stalled message pins the committed offset; a crash redelivers everything after it.

Four queues of 2201 messages each. The consumer's listener blocks on the message at offset 2101 of queue 1
while every other message completes, so the queue's commit offset stays at 2101 (smallest unfinished) and
``consumerOffset.json`` shows it. The consumer is then killed (no offset persisted on the way out) and a new
member of the group takes over: it receives 2101..2200 of queue 1 again — 2102..2200 for the second time.
"""

from __future__ import annotations

import json
import threading
from collections import Counter

from broker_sim import (
    Broker,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)
from broker_sim.faults import FaultKind
from tests.waiting import wait_until

PER_QUEUE = 2201
STALL_QUEUE, STALL_OFFSET = 1, 2101


def fill(broker: Broker) -> None:
    p = Producer(broker, "P")
    for q in range(4):
        mq = MessageQueue("T", "broker-a", q)
        for start in range(0, PER_QUEUE, 100):
            n = min(100, PER_QUEUE - start)
            p.send_batch([Message("T", f"{q}:{start + i}".encode()) for i in range(n)], queue=mq)
    p.shutdown()
    broker.store.wait_dispatched()


def test_stalled_offset_kill_and_redelivery(broker: Broker) -> None:
    fill(broker)
    release = threading.Event()
    stalled = threading.Event()
    lock = threading.Lock()
    first: list[tuple[int, int]] = []
    second: list[tuple[int, int]] = []

    def listener1(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:
            if (m.queue_id, m.queue_offset) == (STALL_QUEUE, STALL_OFFSET):
                stalled.set()
                release.wait(60)  # stuck (a slow downstream call); the kill happens meanwhile
            with lock:
                first.append((m.queue_id, m.queue_offset))
        return ConsumeStatus.CONSUME_SUCCESS

    def listener2(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            second.extend((m.queue_id, m.queue_offset) for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    kw = {
        "consume_from_where": ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        "consume_message_batch_max_size": 1,
    }
    c1 = PushConsumer(broker, "G", **kw).subscribe("T", "*", listener1).start()  # type: ignore[arg-type]
    try:
        wait_until(stalled.is_set, what="the stall at 2101")
        wait_until(lambda: len(first) == 4 * PER_QUEUE - 1, timeout=60, what="everything but 2101")
        # the listener records a message before it returns, and the message leaves its process queue only
        # after that: wait for the last ones to be finished, not just seen
        expected = {q: STALL_OFFSET if q == STALL_QUEUE else PER_QUEUE for q in range(4)}
        queues = {q: MessageQueue("T", "broker-a", q) for q in range(4)}
        wait_until(
            lambda: {q: c1.process_queues[mq].committable_offset() for q, mq in queues.items()} == expected,
            what="every finished message committable",
        )
        c1.persist_offsets()  # the consumer's 5-second commit tick
        broker.persist_all()  # and the broker's 5-second flush of consumerOffset.json
        table = json.loads((broker.store.config_dir / "consumerOffset.json").read_text())["offsetTable"][
            "T@G"
        ]
        assert table == {"0": PER_QUEUE, "1": STALL_OFFSET, "2": PER_QUEUE, "3": PER_QUEUE}

        broker.faults.kill_consumer(c1)
        assert broker.faults.counts[FaultKind.CONSUMER_KILLED] == 1
        assert broker.get_consumer_list_by_group("G") == []  # connection gone: the group is empty at once

        c2 = PushConsumer(broker, "G", **kw).subscribe("T", "*", listener2).start()  # type: ignore[arg-type]
        wait_until(
            lambda: len(second) >= PER_QUEUE - STALL_OFFSET, what="redelivery from the committed offset"
        )
        c2.persist_offsets()
        wait_until(
            lambda: broker.query_consumer_offset("G", "T", STALL_QUEUE) == PER_QUEUE, what="c2's commit"
        )
        assert sorted(second) == [(STALL_QUEUE, o) for o in range(STALL_OFFSET, PER_QUEUE)]
        duplicates = Counter(first + second)
        dup = sorted(k for k, n in duplicates.items() if n > 1)
        assert dup == [
            (STALL_QUEUE, o) for o in range(STALL_OFFSET + 1, PER_QUEUE)
        ]  # 2102..2200: 99 duplicates
        c2.shutdown()
    finally:
        release.set()
