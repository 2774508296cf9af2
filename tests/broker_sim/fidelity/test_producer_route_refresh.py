"""A running producer learns a topic's new queues from the name server within ``pollNameServerInterval``
(30 s in 4.9.8: ``MQClientInstance.updateTopicRouteInfoFromNameServer`` re-reads every publish topic's
route on that timer), as after ``mqadmin updateTopic -w 8 -r 8`` on a 4-queue topic. Until 2026-11-29 a
broker_sim producer kept the route it first read for its whole life (it re-read it only after a failed
send): a long-running producer never wrote to the queues an operator added."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_sim import Broker, ManualClock, Message, Producer
from tests.waiting import wait_until

from .conftest import SMALL_STORE


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def broker(tmp_path: Path, clock: ManualClock) -> Iterator[Broker]:
    b = Broker(tmp_path / "store", topics={"T": 4}, clock=clock, **SMALL_STORE).start()
    yield b
    b.shutdown()


def _queues_of(producer: Producer, n: int) -> Counter[int]:
    return Counter(producer.send(Message("T", b"x")).queue_id for _ in range(n))


def test_a_running_producer_writes_to_added_queues_within_the_route_poll(
    broker: Broker, clock: ManualClock
) -> None:
    producer = Producer(broker, "P", clock=clock)
    try:
        assert set(_queues_of(producer, 8)) == {0, 1, 2, 3}
        broker.create_topic("T", read_queue_nums=8, write_queue_nums=8)
        # before the next poll the producer still writes to the queues it knew (as a Java producer does)
        assert set(_queues_of(producer, 8)) == {0, 1, 2, 3}
        clock.advance(30)
        wait_until(
            lambda: len(producer.fetch_publish_message_queues("T")) == 8, timeout=10, what="the route re-read"
        )
        assert _queues_of(producer, 16) == Counter({q: 2 for q in range(8)})
    finally:
        producer.shutdown()
