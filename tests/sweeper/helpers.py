"""Test helpers of the sweeper: a controllable clock, a real in-process sender, and row builders.

The sender implements the production ``Sender`` protocol for real: it assigns offsets per (topic, queue) the
way a broker does and keeps what it accepted; only the broker process is left out (broker_sim covers that).
"""

from __future__ import annotations

import datetime as dt
import itertools
import threading
from typing import Any

from sqlalchemy import Engine, delete, insert

from reliable import Reliability
from reliable.models import ConsumeProgress, MessageLog, MessageStub, StubNotification
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.types import StubStatus

T0 = dt.datetime(2026, 11, 21, 12, 0, 0, tzinfo=dt.UTC)


class Clock:
    """A clock the test moves by hand; every due-time decision of the sweeper reads it."""

    def __init__(self, now: dt.datetime = T0) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


class QueueSender:
    """Accepts messages onto ``queues`` queues (round-robin) with per-queue offsets starting at ``start``.

    ``fail_next`` makes the next N sends raise (the broker refused), like a producer hitting a dead broker.
    Thread-safe, so two sweepers in two threads can share it and the test can look for a double send.
    """

    def __init__(self, queues: int = 4, start: int = 1000) -> None:
        self.sent: list[OutgoingMessage] = []
        self.receipts: list[SendReceipt] = []
        self.fail_next = 0
        self._queues = itertools.cycle(range(queues))
        self._next: dict[tuple[str, int], int] = {}
        self._start = start
        self._lock = threading.Lock()

    def send(self, message: OutgoingMessage) -> SendReceipt:
        with self._lock:
            if self.fail_next > 0:
                self.fail_next -= 1
                raise ConnectionError("broker refused the connection")
            queue_id = next(self._queues)
            offset = self._next.get((message.topic, queue_id), self._start)
            self._next[(message.topic, queue_id)] = offset + 1
            receipt = SendReceipt(
                queue_id=queue_id, queue_offset=offset, broker_message_id=f"b{len(self.sent)}"
            )
            self.sent.append(message)
            self.receipts.append(receipt)
            return receipt

    def ids(self) -> list[str]:
        with self._lock:
            return [m.message_id for m in self.sent]


def clean(engine: Engine) -> None:
    with engine.begin() as conn:
        for model in (StubNotification, MessageLog, ConsumeProgress, MessageStub):
            conn.execute(delete(model))


def add_stub(rel: Reliability, message_id: str, **fields: Any) -> None:
    row: dict[str, Any] = {
        "message_id": message_id,
        "topic": "orders",
        "tags": None,
        "consumer_group": "billing",
        "content": f"body-{message_id}".encode(),
        "status": StubStatus.PENDING,
        "send_count": 1,
        "queue_id": 0,
        "queue_offset": None,
        "resend_at": T0 - dt.timedelta(seconds=1),
        "created_at": T0 - dt.timedelta(hours=1),
        "updated_at": T0 - dt.timedelta(hours=1),
        "last_sent_at": T0 - dt.timedelta(hours=1),
    }
    row.update(fields)
    with rel.engine.begin() as conn:
        conn.execute(insert(MessageStub.__table__), [row])


def add_log(rel: Reliability, message_id: str, received_at: dt.datetime, **fields: Any) -> None:
    row: dict[str, Any] = {
        "message_id": message_id,
        "consumer_group": "billing",
        "topic": "orders",
        "queue_id": 0,
        "queue_offset": 0,
        "reconsume_times": 0,
        "received_at": received_at,
    }
    row.update(fields)
    with rel.engine.begin() as conn:
        conn.execute(insert(MessageLog.__table__), [row])


def set_progress(
    rel: Reliability,
    max_offset: int,
    *,
    group: str = "billing",
    topic: str = "orders",
    queue_id: int = 0,
    min_offset: int = 0,
    created_at: dt.datetime = T0 - dt.timedelta(hours=1),
    updated_at: dt.datetime = T0,
) -> None:
    with rel.engine.begin() as conn:
        conn.execute(
            delete(ConsumeProgress).where(
                ConsumeProgress.consumer_group == group,
                ConsumeProgress.topic == topic,
                ConsumeProgress.queue_id == queue_id,
            )
        )
        conn.execute(
            insert(ConsumeProgress.__table__),
            [
                {
                    "consumer_group": group,
                    "topic": topic,
                    "queue_id": queue_id,
                    "max_offset": max_offset,
                    "min_offset": min_offset,
                    "created_at": created_at,
                    "updated_at": updated_at,
                    "received_count": max_offset - min_offset + 1,
                }
            ],
        )


def get_stub(rel: Reliability, message_id: str) -> MessageStub:
    with rel.session() as s:
        row = s.get(MessageStub, message_id)
        assert row is not None, message_id
        return row
