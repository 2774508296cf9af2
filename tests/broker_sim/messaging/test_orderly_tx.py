"""Orderly consumption (queue locks, local retry, DLQ after the maximum) and transactional messages."""

from __future__ import annotations

import threading
from collections import defaultdict
from functools import partial

from broker_sim import (
    Broker,
    ConsumeOrderlyStatus,
    LocalTransactionState,
    ManualClock,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
    TransactionProducer,
)
from tests.waiting import wait_until


def test_orderly_keeps_per_key_order_under_failures(broker: Broker) -> None:
    p = Producer(broker, "P")
    keys = [f"order-{k}" for k in range(6)]
    for seq in range(15):
        for key in keys:
            p.send_orderly(Message("T", f"{key}:{seq}".encode(), keys=key), key)
    lock = threading.Lock()
    attempts: dict[str, list[tuple[int, int]]] = defaultdict(list)  # key -> (seq, reconsume times)
    done: dict[str, list[int]] = defaultdict(list)
    active: set[int] = set()
    overlap = []

    def listener(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        qid = msgs[0].queue_id
        with lock:
            if qid in active:
                overlap.append(qid)  # two threads on one queue would break ordering
            active.add(qid)
        try:
            m = msgs[0]
            key, seq = m.body.decode().split(":")
            with lock:
                attempts[key].append((int(seq), m.reconsume_times))
            if int(seq) % 4 == 1 and m.reconsume_times < 2:  # fail twice, then succeed
                return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            with lock:
                done[key].append(int(seq))
            return ConsumeOrderlyStatus.SUCCESS
        finally:
            with lock:
                active.discard(qid)

    c = PushConsumer(broker, "G", suspend_current_queue_time_ms=5)
    c.register_message_listener_orderly(listener)
    c.subscribe("T", "*").start()
    wait_until(lambda: sum(len(v) for v in done.values()) == 90, timeout=30, what="every message in order")
    assert overlap == []
    for key in keys:
        assert done[key] == list(range(15))
        seqs = [s for s, _ in attempts[key]]
        assert seqs == sorted(seqs)  # a failed message is retried before anything after it
        assert [r for s, r in attempts[key] if s == 1] == [0, 1, 2]
    for q in range(4):
        assert broker.locks.holder("G", MessageQueue("T", "broker-a", q)) == c.client_id
    assert broker.retry_messages("G") == []  # orderly retries locally, never through %RETRY%
    c.shutdown()
    p.shutdown()


def test_orderly_dead_letters_after_max_attempts_and_moves_on(broker: Broker) -> None:
    p = Producer(broker, "P")
    q = MessageQueue("T", "broker-a", 2)
    for body in (b"poison", b"next"):
        p.send(Message("T", body), queue=q)
    seen: list[tuple[bytes, int]] = []

    def listener(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        seen.append((msgs[0].body, msgs[0].reconsume_times))
        if msgs[0].body == b"poison":
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    c = PushConsumer(broker, "G", suspend_current_queue_time_ms=5, max_reconsume_times=3)
    c.register_message_listener_orderly(listener)
    c.subscribe("T", "*").start()
    wait_until(lambda: (b"next", 0) in seen, what="the queue to move past the poison message")
    assert seen[:4] == [(b"poison", 0), (b"poison", 1), (b"poison", 2), (b"poison", 3)]
    dead = broker.dlq_messages("G")
    assert [m.body for m in dead] == [b"poison"]
    c.persist_offsets()
    assert broker.query_consumer_offset("G", "T", 2) == 2
    c.shutdown()
    p.shutdown()


def test_broker_queue_locks_expire_after_60_seconds(manual_broker: Broker, clock: ManualClock) -> None:
    mq = MessageQueue("T", "broker-a", 0)
    assert manual_broker.lock_batch_mq("G", "a", {mq}) == {mq}
    assert manual_broker.lock_batch_mq("G", "b", {mq}) == set()
    clock.advance(59)
    assert manual_broker.lock_batch_mq("G", "a", {mq}) == {mq}  # renewal
    clock.advance(59)
    assert manual_broker.lock_batch_mq("G", "b", {mq}) == set()
    clock.advance(2)
    assert manual_broker.lock_batch_mq("G", "b", {mq}) == {mq}
    manual_broker.unlock_batch_mq("G", "a", {mq})  # not the holder: no effect
    assert manual_broker.locks.holder("G", mq) == "b"


def test_transaction_commit_rollback_and_check_back(manual_broker: Broker, clock: ManualClock) -> None:
    b = manual_broker
    decisions = {
        b"commit": LocalTransactionState.COMMIT_MESSAGE,
        b"rollback": LocalTransactionState.ROLLBACK_MESSAGE,
        b"unknown": LocalTransactionState.UNKNOW,
        b"never": LocalTransactionState.UNKNOW,
    }
    checked: list[bytes] = []

    def checker(msg: MessageExt) -> LocalTransactionState:
        checked.append(msg.body)
        return (
            LocalTransactionState.COMMIT_MESSAGE if msg.body == b"unknown" else LocalTransactionState.UNKNOW
        )

    tp = TransactionProducer(b, "TP", executor=lambda m, arg: decisions[m.body], checker=checker)
    results = {
        body: tp.send_message_in_transaction(Message("T", body, keys=body.decode())) for body in decisions
    }
    assert results[b"commit"].local_transaction_state is LocalTransactionState.COMMIT_MESSAGE

    def visible() -> set[bytes]:
        return {m.body for q in range(4) for m in b.messages("T", q)}

    wait_until(lambda: visible() == {b"commit"}, what="only the committed message")
    committed = next(m for q in range(4) for m in b.messages("T", q))
    assert committed.uniq_key == results[b"commit"].msg_id and committed.sys_flag & 0xC == 0x8
    clock.advance(60)  # first check-back round: "unknown" is committed by the checker
    wait_until(lambda: visible() == {b"commit", b"unknown"}, what="the checked message")
    # the checker runs on the producer's threads: "never" may be asked after "unknown" is already visible
    wait_until(lambda: sorted(checked) == [b"never", b"unknown"], what="both open transactions checked")

    def answered_after(n: int) -> bool:
        return len(checked) > n or bool(b.transactions.discarded)

    for _ in range(20):  # "never" is asked 15 times in all, then discarded
        n = len(checked)
        clock.advance(60)
        wait_until(partial(answered_after, n), what="a round's check answered")
        if b.transactions.discarded:
            break
    assert b.transactions.discarded == 1
    assert checked.count(b"never") == 15
    assert visible() == {b"commit", b"unknown"}
    tp.shutdown()
