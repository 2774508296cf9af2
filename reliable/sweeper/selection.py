"""Which stubs are due: the one SQL statement per batch (DESIGN.md §3).

A stub is *due for a resend* when all of these hold::

    status = 'PENDING'                        it is still unconfirmed
    send_count < max_sends                    the budget is not spent (else: give-up, same predicate)
    resend_at <= now                          its backoff (+ backlog estimate) has elapsed
    and either
      NOT EXISTS message_log (message_id, consumer_group)        never received by its group …
      and (queue_offset IS NULL                                  … and the send never got a result,
           OR queue_offset <= consume_progress.max_offset)       … or its group has received that offset
                                                                   of the SAME topic/queue_id
    or
      max(message_log.received_at) < now - stuck_after           received, still pending, and the newest
                                                                   delivery is old: a worker died mid-way
                                                                   (the Redis lease is checked afterwards)

``<=`` and not ``<`` (a correction to the literal text of DESIGN.md §3, which reads like RocketMQ's
"next offset to consume"): ``consume_progress.max_offset`` is the highest offset the group has *received*,
and the consumer journals the ``message_log`` row and raises that watermark in one transaction. So when the
watermark equals the stub's offset and there is no log row, the message received at that offset was a
different one — the broker lost ours and reused the offset (crash before flush). With ``<`` such a stub
would wait until another message arrives on that queue, which on a quiet queue is never. A stub whose
offset is above the watermark is waiting in the backlog and is not touched; a stub whose group has no
``consume_progress`` row for the queue is also treated as queued (the group never consumed there).

``resend_at IS NULL`` is never due: the producer sets it when it writes the stub (``first_resend_delay_s``),
so a stub whose first send is still in flight is not raced by the sweeper.

Both log conditions are correlated subqueries on ``ix_message_log_message_id_consumer_group_received_at``
and the watermark is a primary-key lookup on ``consume_progress``, so the statement is an ordered range scan
of ``ix_message_stub_status_resend_at`` that stops after ``limit`` matching rows (see docs/sweeper.md for the
PostgreSQL plan). Subqueries instead of joins also keep ``FOR UPDATE`` from locking the log and progress
rows on MariaDB, which has no ``FOR UPDATE OF``.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Select, Table, and_, exists, func, or_, select, true

from reliable.models import ConsumeProgress, MessageLog, MessageStub, StubNotification, UTCDateTime
from reliable.types import StubStatus

stub = cast(Table, MessageStub.__table__)
log = cast(Table, MessageLog.__table__)
progress = cast(Table, ConsumeProgress.__table__)
notif = cast(Table, StubNotification.__table__)


class Budget(enum.Enum):
    """Which side of ``max_sends`` a statement looks at."""

    RESEND = "resend"  # send_count < max_sends: send again
    EXHAUSTED = "exhausted"  # send_count >= max_sends: would be re-sent, but must go DEAD instead
    #: both at once: what the sweeper runs, so ONE index scan per batch serves resend and give-up (a
    #: separate give-up statement would scan every due stub each round only to find the few at budget);
    #: the sweeper splits the rows on ``send_count`` and never re-sends one at budget.
    ANY = "any"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A due stub as the selection statement returns it."""

    message_id: str
    topic: str
    tags: str | None
    consumer_group: str
    content: bytes
    send_count: int
    queue_id: int | None
    queue_offset: int | None
    #: newest ``message_log.received_at`` of its group; ``None`` = never received (not a stuck stub).
    last_received_at: dt.datetime | None
    #: ``consume_progress.max_offset`` of its group/topic/queue (``None``: the group never consumed there);
    #: selected only by the give-up statement, for the reason a person reads.
    watermark: int | None = None
    #: the message's stored trace context (JSON), put back into the resend's properties (reliable.otel)
    trace_context: str | None = None

    @property
    def stuck(self) -> bool:
        """Received but never confirmed: the re-send needs a look at the Redis lease first."""
        return self.last_received_at is not None

    @classmethod
    def from_row(cls, row: Any, with_watermark: bool = False) -> Candidate:
        return cls(
            message_id=row.message_id,
            topic=row.topic,
            tags=row.tags,
            consumer_group=row.consumer_group,
            content=bytes(row.content),
            send_count=int(row.send_count),
            queue_id=row.queue_id,
            queue_offset=row.queue_offset,
            last_received_at=row.last_received_at,
            watermark=row.watermark if with_watermark else None,
            trace_context=row.trace_context,
        )


#: the index the selection walks (named by the models' naming convention; created by migration 0001)
STATUS_RESEND_INDEX = "ix_message_stub_status_resend_at"


def due_statement(
    *,
    now: dt.datetime,
    stuck_after: dt.timedelta,
    max_sends: int,
    limit: int,
    budget: Budget = Budget.RESEND,
) -> Select[Any]:
    """The selection statement (without locking clauses: :mod:`reliable.sweeper.claim` adds them)."""
    same_group_log = and_(
        log.c.message_id == stub.c.message_id, log.c.consumer_group == stub.c.consumer_group
    )
    last_received = (
        select(func.max(log.c.received_at, type_=UTCDateTime())).where(same_group_log).scalar_subquery()
    )
    watermark = (
        select(progress.c.max_offset)
        .where(
            progress.c.consumer_group == stub.c.consumer_group,
            progress.c.topic == stub.c.topic,
            progress.c.queue_id == stub.c.queue_id,
        )
        .scalar_subquery()
    )
    never_received_and_passed = and_(
        ~exists().where(same_group_log),
        or_(stub.c.queue_offset.is_(None), stub.c.queue_offset <= watermark),
    )
    stuck = last_received < now - stuck_after
    budget_clause = {
        Budget.RESEND: stub.c.send_count < max_sends,
        Budget.EXHAUSTED: stub.c.send_count >= max_sends,
        Budget.ANY: true(),
    }[budget]
    return (
        select(
            stub.c.message_id,
            stub.c.topic,
            stub.c.tags,
            stub.c.consumer_group,
            stub.c.content,
            stub.c.send_count,
            stub.c.queue_id,
            stub.c.queue_offset,
            stub.c.trace_context,
            last_received.label("last_received_at"),
            *([watermark.label("watermark")] if budget is Budget.EXHAUSTED else []),
        )
        .where(
            stub.c.status == StubStatus.PENDING,
            budget_clause,
            stub.c.resend_at <= now,
            or_(never_received_and_passed, stuck),
        )
        .order_by(stub.c.resend_at)
        .limit(limit)
        # MariaDB/MySQL may pick a full scan + filesort on a small or freshly loaded table; under
        # FOR UPDATE that locks every row it reads, so a second sweeper's SKIP LOCKED finds nothing. The
        # (status, resend_at) index keeps the scan, and the locks, to the due rows in order.
        .with_hint(stub, f"FORCE INDEX ({STATUS_RESEND_INDEX})", dialect_name="mysql")
        .with_hint(stub, f"FORCE INDEX ({STATUS_RESEND_INDEX})", dialect_name="mariadb")
    )
