"""Queue selection for producers: the route a topic is sent by, round-robin over writable queues,
sharding-key hash, and RocketMQ's latency-based fault avoidance (brokers that answered slowly or failed are
skipped for a while)."""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from broker_sim.common.errors import BrokerResponseError
from broker_sim.common.message import Message, MessageQueue
from broker_sim.common.requests import Perm, ResponseCode, TopicRouteData
from broker_sim.common.transport import BrokerTransport

MessageQueueSelector = Callable[[Sequence[MessageQueue], Message, Any], MessageQueue]


def select_by_hash(mqs: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    """``SelectMessageQueueByHash``: same sharding key → same queue (a stable hash, unlike Python's
    ``hash``)."""
    return mqs[zlib.crc32(str(arg).encode("utf-8")) % len(mqs)]


def select_by_random(mqs: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    return random.choice(list(mqs))


def publish_route(
    transport: BrokerTransport, topic: str, default_queue_nums: int
) -> tuple[TopicRouteData, bool]:
    """The route a producer sends ``topic`` by, and whether it is borrowed: a topic that does not exist yet
    gets ``TBW102``'s route, capped to ``default_queue_nums`` as RocketMQ's client does, so the first send
    lands on a queue the auto-created topic will have (a borrowed route is looked up again next time)."""
    try:
        return transport.get_route(topic), False
    except BrokerResponseError as exc:
        if exc.code != ResponseCode.TOPIC_NOT_EXIST:
            raise
        try:
            template = transport.get_route("TBW102")
        except BrokerResponseError:
            raise exc from None
    n = default_queue_nums
    queues = [
        dataclasses.replace(
            q, read_queue_nums=min(n, q.read_queue_nums), write_queue_nums=min(n, q.write_queue_nums)
        )
        for q in template.queue_datas
    ]
    return dataclasses.replace(template, queue_datas=queues), True


class TopicPublishInfo:
    """A topic's writable queues, in route order, with the round-robin counter RocketMQ keeps per topic."""

    def __init__(self, topic: str, route: TopicRouteData) -> None:
        self.topic = topic
        self.route = route
        self.queues: list[MessageQueue] = []
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            if qd.perm & Perm.WRITE:
                self.queues.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
        self._counter = itertools.count(random.randrange(1 << 16))

    def next_index(self) -> int:
        return next(self._counter)  # one C call, atomic under the GIL: thread-safe without a lock

    def select(self, last_broker: str | None) -> MessageQueue:
        """Next queue round-robin, avoiding ``last_broker`` (the one that just failed) when another exists."""
        n = len(self.queues)
        if last_broker is not None:
            for _ in range(n):
                mq = self.queues[self.next_index() % n]
                if mq.broker_name != last_broker:
                    return mq
        return self.queues[self.next_index() % n]


@dataclass
class _FaultItem:
    latency_ms: int
    start_ms: int  # available again from this clock time


class LatencyFaultTolerance:
    """``MQFaultStrategy``: a send that took ``latency`` isolates its broker for the matching duration."""

    LATENCY_MAX = (50, 100, 550, 1000, 2000, 3000, 15000)
    NOT_AVAILABLE_DURATION = (0, 0, 30000, 60000, 120000, 180000, 600000)

    def __init__(self, now_ms: Callable[[], int]) -> None:
        self._now = now_ms
        self._lock = threading.Lock()
        self._items: dict[str, _FaultItem] = {}

    def update(self, broker_name: str, latency_ms: int, isolation: bool) -> None:
        latency = 30_000 if isolation else latency_ms
        duration = 0
        for i in range(len(self.LATENCY_MAX) - 1, -1, -1):
            if latency >= self.LATENCY_MAX[i]:
                duration = self.NOT_AVAILABLE_DURATION[i]
                break
        with self._lock:
            self._items[broker_name] = _FaultItem(latency, self._now() + duration)

    def is_available(self, broker_name: str) -> bool:
        with self._lock:
            item = self._items.get(broker_name)
            return item is None or self._now() >= item.start_ms

    def pick_one_at_least(self) -> str | None:
        """The isolated broker that will recover first (used when every broker is isolated)."""
        with self._lock:
            if not self._items:
                return None
            return min(self._items.items(), key=lambda kv: (kv[1].start_ms, kv[1].latency_ms))[0]

    def select(self, info: TopicPublishInfo, last_broker: str | None) -> MessageQueue:
        n = len(info.queues)
        for _ in range(n):
            mq = info.queues[info.next_index() % n]
            if self.is_available(mq.broker_name):
                return mq
        best = self.pick_one_at_least()
        if best is not None:
            for mq in info.queues:
                if mq.broker_name == best:
                    return mq
        return info.select(last_broker)
