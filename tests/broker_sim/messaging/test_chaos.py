"""A seeded mix of faults: lost send ACKs, lost offset commits, forced rebalances and a killed consumer.
Whatever happens, every message the producer was told was sent is consumed at least once, and every
duplicate has a recorded cause."""

from __future__ import annotations

import random
import threading
from collections import Counter

from broker_sim import Broker, ConsumeStatus, Message, MessageExt, Producer, PushConsumer
from broker_sim.common.errors import SendFailedError
from broker_sim.faults import FaultInjector, FaultKind
from tests.waiting import wait_until


def test_seeded_chaos_loses_nothing_acknowledged(broker: Broker) -> None:
    rnd = random.Random(4)
    broker.faults = FaultInjector(seed=4, clock=broker.clock)  # same seed, same faults
    broker.faults.lose_send_acks(0, probability=0.05)
    lock = threading.Lock()
    seen: Counter[str] = Counter()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            seen.update(m.key_list[0] for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    consumers = [
        PushConsumer(broker, "G", instance_name=f"c{i}").subscribe("T", "*", listener).start()
        for i in range(3)
    ]
    p = Producer(broker, "P", retry_times_when_send_failed=4)
    acked: list[str] = []
    failed: list[str] = []
    for i in range(300):
        key = f"id{i}"
        try:
            p.send(Message("T", b"x", keys=key))
            acked.append(key)
        except SendFailedError:
            failed.append(key)  # the ACK was lost: the budget is spent, the message may well be stored
        if i == 100:
            broker.faults.lose_offset_commits(20, group="G")
        if i == 150:
            broker.faults.force_rebalance(consumers[rnd.randrange(3)])
        if i == 200:
            broker.faults.kill_consumer(consumers.pop(0))
    wait_until(lambda: all(seen[k] >= 1 for k in acked), timeout=30, what="every acknowledged message")
    counts = broker.faults.counts
    assert counts[FaultKind.LOST_SEND_ACK] > 0 and counts[FaultKind.CONSUMER_KILLED] == 1
    stored = Counter(m.key_list[0] for q in range(4) for m in broker.messages("T", q))
    # RocketMQ 4.9.8 (DefaultMQProducerImpl.sendDefaultImpl) does not retry after a timeout: every lost ACK
    # is one failed send whose message is stored once — no producer-side duplicate.
    assert len(failed) == counts[FaultKind.LOST_SEND_ACK]
    assert set(stored.values()) == {1} and len(stored) == 300
    for c in consumers:
        c.shutdown()
    p.shutdown()
