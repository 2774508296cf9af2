"""What the stub-first producer tests share: a clock the tests move, a sender that records what it was
given (the broker side is exercised for real in tests/adapters), a business table, and readers of the stub
and inbox rows."""

from __future__ import annotations

import datetime as dt
import itertools

from sqlalchemy import Column, Integer, MetaData, String, Table, select

from reliable import Reliability, StubStatus
from reliable.models import MessageInbox, MessageStub
from reliable.sender import OutgoingMessage, SendReceipt

T0 = dt.datetime(2026, 11, 21, 12, 0, 0, tzinfo=dt.UTC)
DELAY_S = 30.0

business = MetaData()
orders = Table(
    "producer_test_order", business, Column("id", Integer, primary_key=True), Column("item", String(40))
)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now


class RecordingSender:
    """Accepts every message and hands out increasing offsets on queue 3 (or fails while ``broken``)."""

    def __init__(self) -> None:
        self.sent: list[OutgoingMessage] = []
        self.broken = False
        self._offsets = itertools.count(100)

    def send(self, message: OutgoingMessage) -> SendReceipt:
        if self.broken:
            raise ConnectionError("broker unreachable")
        self.sent.append(message)
        return SendReceipt(
            queue_id=3, queue_offset=next(self._offsets), broker_message_id=f"b-{len(self.sent)}"
        )


def stub(rel: Reliability, message_id: str) -> MessageStub | None:
    with rel.session() as s:
        return s.get(MessageStub, message_id)


def inbox(rel: Reliability, message_id: str) -> dict[str, tuple[StubStatus, dt.datetime | None]]:
    """group → (status, resend_at) of the message's inbox rows."""
    with rel.session() as s:
        rows = s.scalars(select(MessageInbox).where(MessageInbox.message_id == message_id)).all()
        return {r.consumer_group: (r.status, r.resend_at) for r in rows}
