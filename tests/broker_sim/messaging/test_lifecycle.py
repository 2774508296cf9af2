"""Consume timeout, broker restart with persisted offsets, and life-cycle errors."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_sim import (
    Broker,
    ConsumeStatus,
    ManualClock,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)
from broker_sim.common.errors import ClientStateError, ServiceNotAvailableError
from broker_sim.common.requests import ConsumeFromWhere
from tests.waiting import wait_until

from .conftest import SMALL_STORE


def collecting(bodies: list[bytes]) -> Callable[[list[MessageExt]], ConsumeStatus]:
    """A listener that appends every body it is given to ``bodies`` and consumes it."""

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        bodies.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    return listener


def test_consume_timeout_sends_the_stuck_message_back(manual_broker: Broker, clock: ManualClock) -> None:
    release = threading.Event()
    seen: list[tuple[int, int]] = []
    q = MessageQueue("T", "broker-a", 0)

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        m = msgs[0]
        seen.append((m.queue_offset, m.reconsume_times))
        if m.body == b"stuck" and m.reconsume_times == 0:
            release.wait(30)
        return ConsumeStatus.CONSUME_SUCCESS

    p = Producer(manual_broker, "P")
    p.send(Message("T", b"stuck"), queue=q)
    p.send(Message("T", b"after"), queue=q)
    c = PushConsumer(manual_broker, "G").subscribe("T", "*", listener).start()
    try:
        wait_until(lambda: (1, 0) in seen, what="the message after the stuck one")
        pq = c.process_queues[q]
        assert pq.committable_offset() == 0
        clock.advance(15 * 60)  # exactly 15 min: not yet over the timeout
        clock.advance(15 * 60)  # the next sweep finds it 30 min old
        wait_until(lambda: pq.committable_offset() == 2, what="the stuck message to be sent back and dropped")
        assert manual_broker.schedule_service is not None
        wait_until(lambda: manual_broker.schedule_service.pending() == {3: 1}, what="the send-back")  # type: ignore[union-attr]
        clock.advance(10)
        wait_until(lambda: any(r == 1 for _, r in seen), what="the retry delivery")
    finally:
        release.set()
    c.shutdown()
    p.shutdown()


def test_offsets_survive_a_broker_restart(store_dir: Path) -> None:
    b = Broker(store_dir, topics={"T": 2}, **SMALL_STORE).start()
    p = Producer(b, "P")
    for i in range(10):
        p.send(Message("T", f"{i}".encode()))
    p.shutdown()
    got: list[bytes] = []
    c = PushConsumer(b, "G").subscribe("T", "*", collecting(got))
    c.start()
    wait_until(lambda: len(got) == 10, what="first 10")
    c.shutdown()
    b.shutdown()
    b2 = Broker(store_dir, **SMALL_STORE).start()  # topics come back from topics.json
    try:
        assert b2.topics.select("T") is not None
        assert sum(b2.query_consumer_offset("G", "T", q) or 0 for q in range(2)) == 10
        p2 = Producer(b2, "P")
        p2.send(Message("T", b"new"))
        p2.shutdown()
        got2: list[bytes] = []
        c2 = PushConsumer(b2, "G").subscribe("T", "*", collecting(got2))
        c2.start()
        wait_until(lambda: got2 == [b"new"], what="only the new message")
        c2.shutdown()
    finally:
        b2.shutdown()


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrently", "orderly"])
def test_graceful_shutdown_commits_what_a_running_listener_finishes(broker: Broker, orderly: bool) -> None:
    """``shutdown()`` waits for the listener calls still running; what they finish is committed before the
    offsets are persisted, so the group's next owner of the queue does not get it (and apply it) again."""
    entered, release = threading.Event(), threading.Event()
    calls: list[bytes] = []
    q = MessageQueue("T", "broker-a", 0)

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        calls.extend(m.body for m in msgs)
        entered.set()
        release.wait(30)
        return ConsumeStatus.CONSUME_SUCCESS

    p = Producer(broker, "P")
    p.send(Message("T", b"in flight"), queue=q)
    p.shutdown()
    c = PushConsumer(broker, "G", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    c.subscribe("T", "*")
    if orderly:
        c.register_message_listener_orderly(listener)
    else:
        c.register_message_listener(listener)
    c.start()
    stopping = threading.Thread(target=c.shutdown)
    try:
        assert entered.wait(30), "the listener was never called"
        stopping.start()
        wait_until(lambda: c.stopped, what="the shutdown to begin")  # it now waits for the listener
    finally:
        release.set()
    stopping.join(30)
    assert not stopping.is_alive()
    assert calls == [b"in flight"]
    assert broker.query_consumer_offset("G", "T", 0) == 1


def test_life_cycle_errors(broker: Broker, store_dir: Path) -> None:
    c = PushConsumer(broker, "G")
    with pytest.raises(ClientStateError):
        c.start()  # no subscription, no listener
    c.subscribe("T", "*", lambda ms: ConsumeStatus.CONSUME_SUCCESS).start()
    with pytest.raises(ClientStateError):
        c.subscribe("U", "*")
    c.shutdown()
    p = Producer(broker, "P")
    p.shutdown()
    with pytest.raises(ClientStateError):
        p.send(Message("T", b"x"))
    stopped = Broker(store_dir.parent / "other", **SMALL_STORE)
    with pytest.raises(ServiceNotAvailableError):
        stopped.get_max_offset("T", 0)


class RecordingChannel:
    """A ClientChannel that records what the broker tells it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.notified: list[str] = []

    @property
    def remote_address(self) -> str:
        return self.name

    def check_transaction_state(self, producer_group: str, request: object, message: object) -> None:
        raise AssertionError("not a producer")

    def notify_consumer_ids_changed(self, consumer_group: str) -> None:
        self.notified.append(consumer_group)


def test_silent_consumers_expire_after_120_seconds_and_the_group_is_told(
    manual_broker: Broker, clock: ManualClock
) -> None:
    from broker_sim.common.requests import (
        ConsumeFromWhere,
        ConsumerData,
        ConsumeType,
        HeartbeatData,
        MessageModel,
        SubscriptionData,
    )

    data = ConsumerData(
        "G",
        ConsumeType.CONSUME_PASSIVELY,
        MessageModel.CLUSTERING,
        ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        (SubscriptionData("T", "*"),),
    )
    a, b = RecordingChannel("a"), RecordingChannel("b")
    manual_broker.heartbeat(HeartbeatData("a", consumers=(data,)), a)
    manual_broker.heartbeat(HeartbeatData("b", consumers=(data,)), b)
    assert manual_broker.get_consumer_list_by_group("G") == ["a", "b"]
    assert a.notified == ["G", "G"] and b.notified == ["G"]  # each join is announced to the members
    assert manual_broker.topics.select("%RETRY%G") is not None  # route for the retry topic (G11)
    clock.advance(100)
    manual_broker.heartbeat(HeartbeatData("b", consumers=(data,)), b)  # b keeps beating, a went silent
    clock.advance(21)
    manual_broker.scan_not_active_channels()
    assert manual_broker.get_consumer_list_by_group("G") == ["b"]
    assert b.notified[-1] == "G" and len(b.notified) == 2
