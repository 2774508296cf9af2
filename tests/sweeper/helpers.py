"""Test helpers of the sweeper: a controllable clock, a real in-process sender, and row builders.

The sender implements the production ``Sender`` protocol for real: it assigns offsets per (topic, queue) the
way a broker does and keeps what it accepted; only the broker process is left out (broker_sim covers that).
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine, MetaData, delete, func, insert, select, update

from reliable import Reliability
from reliable.models import ConsumeProgress, MessageInbox, MessageLog, MessageStub, StubNotification
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.sweeper import DeadNotice
from reliable.sweeper.notices import RedisPhase
from reliable.sweeper.selection import Candidate, inbox, log, progress, stub
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


class MemoryChannel:
    """A notification channel that keeps what it was given (a real one, minus the network)."""

    def __init__(self, name: str = "memory") -> None:
        self.name = name
        self.notices: list[DeadNotice] = []

    def deliver(self, notices: Sequence[DeadNotice]) -> None:
        self.notices.extend(notices)


class QueueSender:
    """Accepts messages onto ``queues`` queues (round-robin) with per-queue offsets starting at ``start``.

    ``fail_next`` makes the next N sends raise (the broker refused), like a producer hitting a dead broker.
    Thread-safe, so two sweepers in two threads can share it and the test can look for a double send.
    """

    def __init__(
        self, queues: int = 4, start: int = 1000, retry_prefix: str | None = None, broker_name: str = ""
    ) -> None:
        self.sent: list[OutgoingMessage] = []
        self.receipts: list[SendReceipt] = []
        self.fail_next = 0
        self._queues = itertools.cycle(range(queues))
        self._next: dict[tuple[str, int], int] = {}
        self._start = start
        self._lock = threading.Lock()
        #: like broker_sim/RocketMQ: a targeted resend lands on ``{retry_prefix}{group}`` (None: the topic)
        self.retry_prefix = retry_prefix
        #: the RocketMQ broker group every send lands on (``''``: a broker without groups)
        self.broker_name = broker_name

    def resend_topic(self, topic: str, group: str) -> str:
        return topic if self.retry_prefix is None else self.retry_prefix + group

    def _topic(self, message: OutgoingMessage) -> str:
        if message.target_group is None:
            return message.topic
        return self.resend_topic(message.topic, message.target_group)

    def send(self, message: OutgoingMessage) -> SendReceipt:
        with self._lock:
            if self.fail_next > 0:
                self.fail_next -= 1
                raise ConnectionError("broker refused the connection")
            queue_id = next(self._queues)
            topic = self._topic(message)
            offset = self._next.get((topic, queue_id), self._start)
            self._next[(topic, queue_id)] = offset + 1
            receipt = SendReceipt(
                queue_id=queue_id,
                queue_offset=offset,
                broker_message_id=f"b{len(self.sent)}",
                broker_name=self.broker_name,
            )
            self.sent.append(message)
            self.receipts.append(receipt)
            return receipt

    def ids(self) -> list[str]:
        with self._lock:
            return [m.message_id for m in self.sent]


#: the ``stub_notification`` rows that tell somebody — not a Redis outage only watched (``REDIS_WATCH …``,
#: told to nobody until it lasts stuck_after): a sweeper's lease read that times out on a loaded machine (the
#: 0.5 s socket timeout) opens one, and the next round that reads Redis closes it
TOLD = ~StubNotification.reason.startswith(f"{RedisPhase.WATCHING.value} ", autoescape=True)


def clean(engine: Engine) -> None:
    with engine.begin() as conn:
        for model in (StubNotification, MessageLog, ConsumeProgress, MessageInbox, MessageStub):
            conn.execute(delete(model))


#: fields of ``add_stub`` that describe the group's inbox row rather than the stub
_INBOX_FIELDS = ("status", "resend_at", "last_error")


def add_stub(
    rel: Reliability, message_id: str, *, groups: Sequence[str] | None = None, **fields: Any
) -> None:
    """A staged message as the producer leaves it after its first send, for one group or several.

    ``send_count`` is the *group's* sends (the producer's plus its resends: ``1 + resend_count``), the way
    the budget counts them; ``queue_id``/``queue_offset`` where the producer's send landed; ``status``,
    ``resend_at``, ``last_error`` belong to every group's inbox row (``consumer_group`` names one group).
    """
    sends = int(fields.pop("send_count", 1))
    group_list = list(groups) if groups is not None else [str(fields.pop("consumer_group", "billing"))]
    status = fields.get("status", StubStatus.PENDING)
    row: dict[str, Any] = {
        "message_id": message_id,
        "topic": "orders",
        "tags": None,
        "content": f"body-{message_id}".encode(),
        "status": status,
        "send_count": min(sends, 1),
        "queue_id": 0,
        "queue_offset": None,
        "resend_at": T0 - dt.timedelta(seconds=1),
        "created_at": T0 - dt.timedelta(hours=1),
        "updated_at": T0 - dt.timedelta(hours=1),
        "last_sent_at": T0 - dt.timedelta(hours=1),
    }
    row.update({k: v for k, v in fields.items() if k not in ("last_error",)})
    inbox_rows = [
        {
            "consumer_group": g,
            "message_id": message_id,
            "status": status,
            "attempts": 0,
            "resend_count": max(sends - 1, 0),
            "resend_at": row["resend_at"],
            "last_error": fields.get("last_error"),
            "created_at": row["created_at"],
            "updated_at": row["created_at"],
        }
        for g in group_list
    ]
    with rel.engine.begin() as conn:
        conn.execute(insert(stub), [row])
        conn.execute(insert(inbox), inbox_rows)


def add_inbox_without_stub(rel: Reliability, message_id: str, **fields: Any) -> None:
    """A group's inbox row whose stub is gone (deleted by hand, or written without a producer): the rows
    :func:`add_stub` writes, then its stub deleted."""
    add_stub(rel, message_id, **fields)
    with rel.engine.begin() as conn:
        conn.execute(delete(stub).where(stub.c.message_id == message_id))


def set_inbox(rel: Reliability, message_id: str, group: str = "billing", **fields: Any) -> None:
    with rel.engine.begin() as conn:
        conn.execute(
            update(inbox)
            .where(MessageInbox.message_id == message_id, MessageInbox.consumer_group == group)
            .values(**fields)
        )


def get_inbox(rel: Reliability, message_id: str, group: str = "billing") -> MessageInbox:
    with rel.session() as s:
        row = s.get(MessageInbox, (group, message_id))
        assert row is not None, (group, message_id)
        return row


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
        conn.execute(insert(log), [row])


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
    broker_name: str = "",
) -> None:
    with rel.engine.begin() as conn:
        conn.execute(
            delete(ConsumeProgress).where(
                ConsumeProgress.consumer_group == group,
                ConsumeProgress.topic == topic,
                ConsumeProgress.queue_id == queue_id,
                ConsumeProgress.broker_name == broker_name,
            )
        )
        conn.execute(
            insert(progress),
            [
                {
                    "consumer_group": group,
                    "topic": topic,
                    "queue_id": queue_id,
                    "broker_name": broker_name,
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


def e2e_reliability(
    url: str, effects: MetaData, redis_url: str = "", key_prefix: str | None = None, **options: Any
) -> Iterator[Reliability]:
    """The end-to-end tests' ``Reliability``: a clean schema, resends due at once, a 2 s lease unless
    ``options`` say otherwise, no Redis unless given, and the test's own effect tables created fresh (a
    generator for a fixture to ``yield from``)."""
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(url)
    settings: dict[str, Any] = {"first_resend_delay_s": 0, "lease_ms": 2000, **options}
    if key_prefix is not None:
        settings["key_prefix"] = key_prefix
    r = Reliability(url, redis_url=redis_url, **settings)
    clean(r.engine)
    effects.drop_all(r.engine)
    effects.create_all(r.engine)
    yield r
    r.close()


def count_stubs(rel: Reliability, status: StubStatus) -> int:
    """How many stubs are in ``status``."""
    with rel.engine.connect() as conn:
        return int(conn.scalar(select(func.count()).where(MessageStub.status == status)) or 0)


def candidate(**fields: Any) -> Candidate:
    """A group's row as the selection returns it: never received, its stub sent an hour before ``T0`` to
    queue 1 at offset 7 of ``orders``; ``fields`` override."""
    row: dict[str, Any] = {
        "consumer_group": "billing",
        "message_id": "m",
        "resend_count": 0,
        "inbox_queue_id": None,
        "inbox_queue_offset": None,
        "created_at": T0 - dt.timedelta(hours=1),
        "inbox_updated_at": T0 - dt.timedelta(hours=1),
        "last_received_at": None,
        "last_reconsume_times": None,
        "last_outcome": None,
        "topic": "orders",
        "stub_queue_id": 1,
        "stub_queue_offset": 7,
        "stub_last_sent_at": T0 - dt.timedelta(hours=1),
    }
    return Candidate(**(row | fields))


def outage_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The sweeper's ERROR lines that Redis lease reads have failed for longer than stuck_after."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and "Redis lease reads have failed" in r.getMessage()
    ]


def unreadable_seconds() -> float | None:
    """The gauge ``reliable_sweeper_redis_unreadable_seconds`` as the process's registry holds it."""
    return REGISTRY.get_sample_value("reliable_sweeper_redis_unreadable_seconds")
