"""The official RocketMQ 5.x Python client (``rocketmq-python-client``) against broker_sim's gRPC front end.

The broker runs in this process on a manual clock, so invisible durations, retry backoff, delivery
timestamps and transaction check-back happen exactly when a test advances time; the client runs unmodified
in the 5.x venv. What a 5.x user relies on: every message arrives, an unacked message comes back with a
higher delivery attempt, an ack stops that, max attempts end in the DLQ, a FIFO message group is delivered in
order, delay and transactional messages behave.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from broker_sim.grpc.policy import GroupPolicy
from broker_sim.store.results import GetMessageStatus
from tests.adapters.rocketmq5.conftest import TOPIC, GrpcBroker, GrpcBrokerFactory
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def receive_ids(client: Any, expected: int, invisible_s: int = 30, ack: bool = True) -> list[dict[str, Any]]:
    got: dict[str, dict[str, Any]] = {}

    def more() -> bool:
        for m in client.call("receive", max=32, invisible_s=invisible_s)["messages"]:
            got[m["id"]] = m
            if ack:
                client.call("ack", handle=m["handle"])
        return len(got) >= expected

    wait_until(more, what=f"{expected} messages")
    return list(got.values())


def stored(broker: GrpcBroker, topic: str, queue_id: int = 0) -> list[Any]:
    """What the store holds on ``topic`` (read past permissions: DLQ topics are write-only)."""
    b = broker.server.broker
    assert b is not None
    r = b.store.get_message("inspect", topic, queue_id, 0, 32, None)
    return [sel.ext for sel in r.messages] if r.status is GetMessageStatus.FOUND else []


def test_every_message_is_received_and_an_ack_stops_redelivery(make_broker: GrpcBrokerFactory) -> None:
    broker = make_broker()
    producer, consumer = broker.client(), broker.client()
    producer.call("producer", topics=[TOPIC])
    sent = {producer.call("send", topic=TOPIC, body=f"m{i}", keys=f"k{i}", tag="t")["id"] for i in range(12)}
    consumer.call("simple", group="G1", topic=TOPIC, await_s=1)
    got = receive_ids(consumer, 12)
    assert {m["id"] for m in got} == sent
    assert all(m["attempt"] == 1 and m["tag"] == "t" for m in got)
    broker.advance(120)  # far past the invisible duration: acked messages must not come back
    assert consumer.call("receive", max=32, invisible_s=30)["messages"] == []


def test_invisible_expiry_redelivers_with_the_next_attempt(make_broker: GrpcBrokerFactory) -> None:
    broker = make_broker()
    producer, consumer = broker.client(), broker.client()
    producer.call("producer", topics=[TOPIC])
    mid = producer.call("send", topic=TOPIC, body="once", keys="k1")["id"]
    consumer.call("simple", group="G2", topic=TOPIC, await_s=1)
    [first] = receive_ids(consumer, 1, invisible_s=20, ack=False)
    assert (first["id"], first["attempt"]) == (mid, 1)
    broker.advance(19)
    assert consumer.call("receive", max=8, invisible_s=20)["messages"] == []  # still invisible
    broker.advance(2)
    [again] = receive_ids(consumer, 1, invisible_s=20, ack=False)
    assert (again["id"], again["attempt"], again["body"]) == (mid, 2, "once")
    assert again["handle"] != first["handle"]
    with pytest.raises(RuntimeError, match=r"stale"):
        consumer.call("ack", handle=first["handle"])  # the first delivery's handle is void now
    consumer.call("ack", handle=again["handle"])
    broker.advance(60)
    assert consumer.call("receive", max=8, invisible_s=20)["messages"] == []


def test_change_invisible_duration_postpones_redelivery(make_broker: GrpcBrokerFactory) -> None:
    broker = make_broker()
    producer, consumer = broker.client(), broker.client()
    producer.call("producer", topics=[TOPIC])
    producer.call("send", topic=TOPIC, body="slow", keys="k")
    consumer.call("simple", group="G3", topic=TOPIC, await_s=1)
    [m] = receive_ids(consumer, 1, invisible_s=10, ack=False)
    broker.advance(8)
    handle = consumer.call("change_invisible", handle=m["handle"], seconds=30)["handle"]
    broker.advance(20)  # 28 s after receipt: past the first duration, inside the extension
    assert consumer.call("receive", max=8, invisible_s=10)["messages"] == []
    consumer.call("ack", handle=handle)
    broker.advance(60)
    assert consumer.call("receive", max=8, invisible_s=10)["messages"] == []


def test_max_attempts_move_the_message_to_the_dead_letter_queue(make_broker: GrpcBrokerFactory) -> None:
    broker = make_broker(groups={"G4": GroupPolicy(max_attempts=2, backoff_s=(1,))})
    producer, consumer = broker.client(), broker.client()
    producer.call("producer", topics=[TOPIC])
    mid = producer.call("send", topic=TOPIC, body="poison", keys="kp")["id"]
    consumer.call("simple", group="G4", topic=TOPIC, await_s=1)
    attempts = []
    for _ in range(2):
        [m] = receive_ids(consumer, 1, invisible_s=5, ack=False)
        attempts.append(m["attempt"])
        broker.advance(6)
    assert attempts == [1, 2]
    assert consumer.call("receive", max=8, invisible_s=5)["messages"] == []
    dlq = wait_until(lambda: stored(broker, "%DLQ%G4"), what="the DLQ copy")
    assert [m.uniq_key for m in dlq] == [mid]


def test_fifo_group_holds_a_message_group_until_its_earlier_message_is_acked(
    make_broker: GrpcBrokerFactory,
) -> None:
    broker = make_broker(groups={"F1": GroupPolicy(fifo=True)})
    producer, consumer = broker.client(), broker.client()
    producer.call("producer", topics=[TOPIC])
    for i in range(4):
        for g in ("ga", "gb"):
            producer.call("send", topic=TOPIC, body=f"{g}-{i}", group=g)
    consumer.call("simple", group="F1", topic=TOPIC, await_s=1)
    seen: dict[str, list[str]] = {"ga": [], "gb": []}
    outstanding: dict[str, str] = {}
    for _ in range(40):
        batch = consumer.call("receive", max=1, invisible_s=60)["messages"]
        for m in batch:
            assert m["group"] not in outstanding, "a message group's next message came before the ack"
            seen[m["group"]].append(m["body"])
            outstanding[m["group"]] = m["handle"]
        if not batch and outstanding:  # ack the oldest outstanding one, releasing its group
            group = sorted(outstanding)[0]
            consumer.call("ack", handle=outstanding.pop(group))
        if sum(map(len, seen.values())) == 8 and not outstanding:
            break
        if sum(map(len, seen.values())) == 8:
            for group in list(outstanding):
                consumer.call("ack", handle=outstanding.pop(group))
    assert seen == {g: [f"{g}-{i}" for i in range(4)] for g in ("ga", "gb")}


def test_delay_message_arrives_at_its_delivery_time(make_broker: GrpcBrokerFactory) -> None:
    broker = make_broker()
    producer, consumer = broker.client(), broker.client()
    producer.call("producer", topics=[TOPIC])
    due_s = broker.clock.now_ms() // 1000 + 300
    mid = producer.call("send", topic=TOPIC, body="later", keys="kd", deliver_at_s=due_s)["id"]
    consumer.call("simple", group="G5", topic=TOPIC, await_s=1)
    broker.advance(290)
    assert consumer.call("receive", max=8, invisible_s=30)["messages"] == []
    broker.advance(11)
    [m] = receive_ids(consumer, 1)
    assert m["id"] == mid and m["body"] == "later"


def test_transactions_commit_rollback_and_check_back(make_broker: GrpcBrokerFactory) -> None:
    broker = make_broker()
    producer, consumer = broker.client(), broker.client()
    producer.call("producer", topics=[TOPIC])
    committed = producer.call("send_tx", topic=TOPIC, body="c", keys="tx-c", resolve="commit")["id"]
    producer.call("send_tx", topic=TOPIC, body="r", keys="tx-r", resolve="rollback")
    producer.call("answer", keys="tx-late", resolution="COMMIT")
    producer.call("answer", keys="tx-never", resolution="ROLLBACK")
    late = producer.call("send_tx", topic=TOPIC, body="late", keys="tx-late", resolve=None)["id"]
    producer.call("send_tx", topic=TOPIC, body="never", keys="tx-never", resolve=None)
    consumer.call("simple", group="G6", topic=TOPIC, await_s=1)
    assert [m["id"] for m in receive_ids(consumer, 1)] == [committed]
    broker.advance(61)  # past the transaction timeout and one check interval: the broker asks the producer

    def checked() -> list[dict[str, Any]]:
        return [e for e in producer.call("events")["events"] if e["event"] == "check"]

    checks: list[dict[str, Any]] = []

    def two_checks() -> bool:
        checks.extend(checked())
        return len(checks) >= 2

    wait_until(two_checks, what="two check-backs")
    assert sorted(c["keys"][0] for c in checks) == ["tx-late", "tx-never"]
    [m] = receive_ids(consumer, 1)
    assert m["id"] == late
    broker.advance(60)
    assert consumer.call("receive", max=8, invisible_s=30)["messages"] == []


def test_push_consumer_gets_everything_and_retries_a_failure_by_the_group_backoff(
    make_broker: GrpcBrokerFactory,
) -> None:
    broker = make_broker(groups={"P1": GroupPolicy(max_attempts=3, backoff_s=(5,))})
    producer, consumer = broker.client(), broker.client()
    producer.call("producer", topics=[TOPIC])
    consumer.call("push", group="P1", topic=TOPIC, fail_bodies=["bad"])
    ids = {producer.call("send", topic=TOPIC, body=b, keys=b)["id"] for b in ("a", "b", "c", "bad")}
    events: list[dict[str, Any]] = []

    def delivered(body: str, attempt: int) -> bool:
        events.extend(consumer.call("events")["events"])
        return any(e["body"] == body and e["attempt"] == attempt for e in events)

    assert broker.server.grpc is not None
    pop = broker.server.grpc.pop
    seen: set[int] = set()

    def backoff_asked() -> bool:
        """The client has changed the failed delivery's invisible duration to the group's 5 s backoff (it
        does so after the listener returns, so the clock may only move once the broker has it)."""
        fresh = {h.serial for h in pop.inflight("P1", TOPIC).values() if h.invisible_ms == 5000} - seen
        seen.update(fresh)
        return bool(fresh)

    wait_until(lambda: all(delivered(b, 1) for b in ("a", "b", "c", "bad")), what="first deliveries")
    assert {e["id"] for e in events} == ids
    for attempt in (2, 3):
        wait_until(backoff_asked, what=f"the backoff after attempt {attempt - 1}")
        broker.advance(6)
        wait_until(partial(delivered, "bad", attempt), what=f"attempt {attempt}")
    wait_until(backoff_asked, what="the backoff after attempt 3")
    broker.advance(6)
    assert wait_until(lambda: stored(broker, "%DLQ%P1"), what="the DLQ copy")[0].body == b"bad"
    assert sorted(e["attempt"] for e in events if e["body"] == "a") == [1]


def test_push_deliveries_are_renewed_while_the_client_lives_then_come_back(
    make_broker: GrpcBrokerFactory,
) -> None:
    """The 5.x proxy renews a push consumer's invisible time while that client is connected; a killed
    client's message is delivered again (attempt 2) one invisible duration later."""
    broker = make_broker()
    producer, pusher, other = broker.client(), broker.client(), broker.client()
    producer.call("producer", topics=[TOPIC])
    pusher.call("push", group="R1", topic=TOPIC)
    mid = producer.call("send", topic=TOPIC, body="hold", keys="kh")["id"]
    wait_until(lambda: any(e["body"] == "hold" for e in pusher.call("events")["events"]), what="delivery")
    other.call("simple", group="R1", topic=TOPIC, await_s=1)
    assert broker.server.grpc is not None
    pop = broker.server.grpc.pop

    def renewed_after(rounds: int) -> bool:
        return pop.renew_rounds > rounds

    for _ in range(30):  # 150 s, far past the 60 s invisible duration
        rounds = pop.renew_rounds
        broker.advance(5)
        wait_until(partial(renewed_after, rounds), what="a renewal round")
        [handle] = pop.inflight("R1", TOPIC).values()
        assert handle.expires_ms > broker.clock.now_ms()
    assert other.call("receive", max=8, invisible_s=30)["messages"] == []
    hub = broker.server.grpc.hub
    alive = len(hub.open_clients())
    pusher.proc.kill()  # the client dies holding the message: no more renewals
    pusher.proc.wait()
    wait_until(lambda: len(hub.open_clients()) < alive, what="the dead client's stream to close")
    broker.advance(61)
    [again] = receive_ids(other, 1)
    assert (again["id"], again["attempt"]) == (mid, 2)


def test_fifo_push_consumer_consumes_each_message_group_in_order(make_broker: GrpcBrokerFactory) -> None:
    broker = make_broker(groups={"F2": GroupPolicy(fifo=True)})
    producer, consumer = broker.client(), broker.client()
    producer.call("producer", topics=[TOPIC])
    assert consumer.call("push", group="F2", topic=TOPIC)["fifo"] is True  # the settings said so
    groups = ("ga", "gb", "gc")
    for i in range(5):
        for g in groups:
            producer.call("send", topic=TOPIC, body=f"{g}-{i}", group=g)
    events: list[dict[str, Any]] = []

    def all_in() -> bool:
        events.extend(consumer.call("events")["events"])
        return len(events) >= 15

    wait_until(all_in, what="15 FIFO deliveries")
    for g in groups:
        assert [e["body"] for e in events if e["group"] == g] == [f"{g}-{i}" for i in range(5)]
