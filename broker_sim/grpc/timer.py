"""Delay messages by delivery timestamp (5.x ``DELAY`` type): any time, not only the 18 delay levels.

A message with a delivery timestamp in the future is stored on the system topic ``rmq_sys_wheel_timer``
(RocketMQ 5's timer topic) with its real topic and queue kept in properties, where no consumer reads it.
A periodic task on the broker's clock (so a :class:`~broker_sim.clock.ManualClock` drives it in tests)
reads that topic, and when a message is due stores a copy on the real topic — from then on it is an
ordinary message for 4.x and 5.x consumers alike. The read position is committed as the consumer offset of
``CID_RMQ_SYS_TIMER``; messages already moved above that position are remembered in memory only, so a
broker restart may deliver one of them twice (at-least-once, like RocketMQ's own timer after a crash).
"""

from __future__ import annotations

import heapq
import logging
import threading
from dataclasses import replace
from typing import TYPE_CHECKING

from broker_sim.broker.api import SendMessageRequest
from broker_sim.broker.topics import TopicConfig
from broker_sim.client.message import MessageExt, Prop
from broker_sim.common.convert import to_client
from broker_sim.errors import BrokerSimError
from broker_sim.grpc.convert import TIMER_DELIVER_MS
from broker_sim.store.results import GetMessageStatus

if TYPE_CHECKING:
    from broker_sim.broker.broker import Broker

log = logging.getLogger("broker_sim.grpc.timer")

TIMER_TOPIC = "rmq_sys_wheel_timer"
TIMER_GROUP = "CID_RMQ_SYS_TIMER"
TICK_MS = 100


class TimerService:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._lock = threading.Lock()
        self._due: list[tuple[int, int]] = []  # (deliver_ms, timer-queue offset), a heap
        self._messages: dict[int, MessageExt] = {}
        self._read = 0
        self.delivered = 0

    def start(self) -> None:
        b = self.broker
        if b.topics.select(TIMER_TOPIC) is None:
            b.topics.update(TopicConfig(TIMER_TOPIC, 1, 1))
        committed = b.query_consumer_offset(TIMER_GROUP, TIMER_TOPIC, 0)
        self._read = committed if committed is not None else 0
        b.scheduler.schedule_periodic(TICK_MS, TICK_MS, self.tick, name="grpc-timer")

    def park(self, req: SendMessageRequest, body: bytes, deliver_ms: int) -> None:
        """Store ``req`` on the timer topic until ``deliver_ms``."""
        props = dict(req.properties)
        props[Prop.REAL_TOPIC] = req.topic
        props[Prop.REAL_QID] = str(req.queue_id)
        props[TIMER_DELIVER_MS] = str(deliver_ms)
        self.broker.send_message(replace(req, topic=TIMER_TOPIC, queue_id=0, properties=props), body)

    def tick(self) -> None:
        with self._lock:
            self._read_new()
            now = self.broker.clock.now_ms()
            while self._due and self._due[0][0] <= now:
                _, offset = heapq.heappop(self._due)
                if self._deliver(self._messages[offset]):
                    del self._messages[offset]
                else:  # the real topic refused it (deleted, no permission): try again in a second
                    heapq.heappush(self._due, (now + 1000, offset))
                    break
            floor = min((o for _, o in self._due), default=self._read)
            self.broker.commit_consumer_offset(TIMER_GROUP, TIMER_TOPIC, 0, floor)

    def _read_new(self) -> None:
        while True:
            r = self.broker.store.get_message(TIMER_GROUP, TIMER_TOPIC, 0, self._read, 32, None)
            if r.status is GetMessageStatus.OFFSET_TOO_SMALL and r.next_begin_offset > self._read:
                self._read = r.next_begin_offset
                continue
            if r.status is not GetMessageStatus.FOUND or r.next_begin_offset <= self._read:
                return
            for sel in r.messages:
                msg = to_client(sel.ext, self.broker.config.broker_name)
                deliver = int(msg.properties.get(TIMER_DELIVER_MS, "0"))
                heapq.heappush(self._due, (deliver, msg.queue_offset))
                self._messages[msg.queue_offset] = msg
            self._read = r.next_begin_offset

    def _deliver(self, msg: MessageExt) -> bool:
        props = dict(msg.properties)
        topic = props.pop(Prop.REAL_TOPIC, "")
        queue_id = int(props.pop(Prop.REAL_QID, "0"))
        req = SendMessageRequest(
            producer_group=props.get(Prop.PRODUCER_GROUP, TIMER_GROUP), topic=topic, queue_id=queue_id,
            properties=props, born_timestamp=msg.born_timestamp, born_host=msg.born_host,
        )  # fmt: skip
        try:
            self.broker.send_message(req, msg.body)
        except BrokerSimError as exc:
            log.warning("timer message %s for %s not delivered yet: %s", msg.msg_id, topic, exc)
            return False
        self.delivered += 1
        return True
