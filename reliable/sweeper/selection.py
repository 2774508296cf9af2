"""Which inbox rows the sweeper looks at: the one SQL statement per batch (DESIGN.md §3).

The unit of work is a group's inbox row, ``message_inbox (consumer_group, message_id)``: in a fan-out every
group must receive the message, and a group that lacks it gets its own (targeted) resend. The statement
selects the rows that *may* need one::

    message_inbox.status = 'PENDING'                       that group has not confirmed it
    1 + resend_count < max_sends                           the group's budget is not spent (the producer's
                                                           send plus the group's own resends; Budget.ANY
                                                           also returns spent rows, which go DEAD)
    resend_at <= now                                       its backoff (+ backlog estimate) has elapsed
    and either
      NOT EXISTS message_log (message_id, consumer_group)  the group never received it …
    or
      max(message_log.received_at) < now - stuck_after     … or received it, and the newest delivery is old:
                                                           a worker may have died mid-way

Whether a never-received row is *lost* (never sent, overtaken by the group's watermark, proven lost by the
broker's max offset, or too old) or merely *queued* is decided per row afterwards, in Python
(:mod:`reliable.sweeper.verdict`): the broker probe is a call to the broker, not a column, and the
watermark to compare with belongs to the topic the group's copy went to (``%RETRY%{group}`` after a
targeted resend), which only the sender knows. Rows found queued are postponed (their ``resend_at`` moves),
so they do not take batch slots every round.

A row whose handler failed ``max_attempts`` times is not ``PENDING``: the guard set it ``DEAD`` when it
dead-lettered the delivery (:mod:`reliable.sweeper.giveup` tells a person). A delivery dead-lettered for its
*body* (``payload_mismatch``: another body under the staged id) does not settle the row: the staged body is
re-sent like that of any stuck row, so a stray copy cannot keep the real message from its group.

``resend_at IS NULL`` is never due: the producer sets it when it writes the inbox rows
(``first_resend_delay_s``), so a send still in flight is not raced by the sweeper.

The log conditions are probes of ``ix_message_log_message_id_consumer_group_received_at`` per row (correlated
subqueries; on PostgreSQL the newest delivery is one ``LATERAL`` probe that brings its time, reconsume count
and outcome together), the budget is a comparison on the inbox row itself, so the statement is an ordered
range scan of ``ix_message_inbox_status_resend_at`` that stops after ``limit`` rows. The stub (topic, body,
topic-wide send) comes with the row where a join locks no stub row — PostgreSQL (``FOR UPDATE OF
message_inbox``) and SQLite (no row locks): :func:`with_stub`. On MariaDB/MySQL, which have no ``FOR UPDATE
OF``, a join would lock the stub rows too, so there :func:`load_stubs` reads them afterwards by primary key,
without a lock (the log conditions are subqueries for the same reason, and MariaDB has no ``LATERAL``).
:func:`due_statement` builds the shape of the engine's dialect; every shape returns the same rows.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from sqlalchemy import Connection, Select, Table, and_, exists, func, or_, select, true

from reliable.models import ConsumeProgress, UTCDateTime, status_literal
from reliable.outbox.tables import inbox as inbox  # re-exported: the sweeper's modules import them here
from reliable.outbox.tables import log as log
from reliable.outbox.tables import notif as notif
from reliable.outbox.tables import stub as stub
from reliable.types import LogOutcome, StubStatus

progress = cast(Table, ConsumeProgress.__table__)


class Budget(enum.Enum):
    """Which side of ``max_sends`` a statement looks at."""

    RESEND = "resend"  # 1 + resend_count < max_sends: send again
    #: both at once: what the sweeper runs, so ONE index scan per batch serves resend and give-up; the
    #: sweeper splits the rows on ``sends`` and never re-sends one at budget.
    ANY = "any"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A group's inbox row as the selection returns it, with its stub (read with it, or by load_stubs)."""

    consumer_group: str
    message_id: str
    #: the group's targeted resends so far (``message_inbox.resend_count``)
    resend_count: int
    #: where the group's last targeted resend landed (``None``: none yet, the stub's send is the copy)
    inbox_queue_id: int | None
    inbox_queue_offset: int | None
    created_at: dt.datetime
    #: when the last targeted resend was recorded (``message_inbox.updated_at``; see verdict.py)
    inbox_updated_at: dt.datetime
    #: newest ``message_log.received_at`` of its group; ``None`` = never received (not a stuck row).
    last_received_at: dt.datetime | None
    #: ``reconsume_times`` and outcome of that newest delivery (the broker's retry schedule, verdict.py)
    last_reconsume_times: int | None
    last_outcome: LogOutcome | None
    # --- from the stub (load_stubs) ---
    topic: str = ""
    tags: str | None = None
    content: bytes = b""
    stub_queue_id: int | None = None
    stub_queue_offset: int | None = None
    stub_last_sent_at: dt.datetime | None = None
    #: the broker groups of the two positions (RocketMQ clusters; ``""``: none, or sent before 0006)
    inbox_broker_name: str = ""
    stub_broker_name: str = ""
    #: the topic the group's last targeted resend landed on (``message_inbox.resend_topic``); ``None``: no
    #: resend, or recorded before migration 0011 (the sender then says: :func:`.resend.copy_topic`)
    inbox_topic: str | None = None
    #: the message's stored trace context (JSON), put back into the resend's properties (reliable.otel)
    trace_context: str | None = None
    #: the producer's message properties (JSON text), put back into the resend's
    properties: str | None = None
    #: the stub columns above are read (with the claim, or by :func:`load_stubs`); ``False`` on a row read
    #: without them, and on a joined row whose stub does not exist
    has_stub: bool = False

    @property
    def sends(self) -> int:
        """The group's sends: the producer's plus its own resends (compared with ``max_sends``)."""
        return 1 + self.resend_count

    @property
    def stuck(self) -> bool:
        """Received but never confirmed: the re-send needs a look at the Redis lease first."""
        return self.last_received_at is not None

    @property
    def targeted(self) -> bool:
        """The group's newest copy is a targeted resend (its position is on the inbox row)."""
        return self.inbox_queue_offset is not None

    @property
    def queue_id(self) -> int | None:
        return self.inbox_queue_id if self.targeted else self.stub_queue_id

    @property
    def broker_name(self) -> str:
        """The broker group of the newest copy's queue: its queue is ``(topic, broker_name, queue_id)``."""
        return self.inbox_broker_name if self.targeted else self.stub_broker_name

    @property
    def queue_offset(self) -> int | None:
        return self.inbox_queue_offset if self.targeted else self.stub_queue_offset

    @property
    def last_sent_at(self) -> dt.datetime | None:
        """When the group's newest copy was sent (the stub's first send before any resend)."""
        return self.inbox_updated_at if self.targeted else self.stub_last_sent_at

    @classmethod
    def from_rows(cls, keys: Sequence[str], rows: Sequence[Any]) -> list[Candidate]:
        """The rows of :func:`due_statement` (``keys``: :data:`SELECTED_KEYS`), or of ``with_stub(…)`` of it
        (:data:`JOINED_KEYS`: the stub's columns too, where the stub exists).

        Unpacked by position: a claimed batch is hundreds of rows, and looking a row's columns up by name was
        most of what building one cost."""
        joined = tuple(keys) == JOINED_KEYS
        if not joined and tuple(keys) != SELECTED_KEYS:
            raise RuntimeError(f"selection columns changed: {tuple(keys)}")
        out: list[Candidate] = []
        for row in rows:
            (group, message_id, resend_count, queue_id, queue_offset, broker_name, resend_topic, created_at,
             updated_at, last_received_at, last_reconsume_times, last_outcome) = row[:_SELECTED]  # fmt: skip
            (stub_id, topic, tags, content, stub_queue_id, stub_queue_offset, stub_last_sent_at,
             trace_context, stub_broker_name, properties) = (
                row[_SELECTED:] if joined else _NO_STUB
            )  # fmt: skip
            out.append(
                cls(
                    consumer_group=group,
                    message_id=message_id,
                    resend_count=int(resend_count),
                    inbox_queue_id=queue_id,
                    inbox_queue_offset=queue_offset,
                    inbox_broker_name=broker_name or "",
                    inbox_topic=resend_topic,
                    created_at=created_at,
                    inbox_updated_at=updated_at,
                    last_received_at=last_received_at,
                    last_reconsume_times=last_reconsume_times,
                    last_outcome=LogOutcome(last_outcome) if last_outcome is not None else None,
                    topic=topic or "",
                    tags=tags,
                    content=b"" if content is None else bytes(content),
                    stub_queue_id=stub_queue_id,
                    stub_queue_offset=stub_queue_offset,
                    stub_last_sent_at=stub_last_sent_at,
                    stub_broker_name=stub_broker_name or "",
                    trace_context=trace_context,
                    properties=properties,
                    has_stub=stub_id is not None,
                )
            )
        return out


#: the index the selection walks (named by the models' naming convention; created by migration 0003)
STATUS_RESEND_INDEX = "ix_message_inbox_status_resend_at"


def due_statement(
    *,
    now: dt.datetime,
    stuck_after: dt.timedelta,
    max_sends: int,
    limit: int,
    budget: Budget = Budget.RESEND,
    dialect: str = "",
) -> Select[Any]:
    """The selection statement (without locking clauses: :mod:`reliable.sweeper.claim` adds them), in the
    shape for ``dialect`` (an engine's ``dialect.name``; the columns are :data:`SELECTED_KEYS` in every
    shape, then :data:`JOINED_KEYS`' stub columns where they come along):

    * ``postgresql``: the newest delivery is one ``LATERAL`` probe of the log per row (its time, reconsume
      count and outcome together, instead of three correlated subqueries), and the stub is joined
      (:func:`with_stub`);
    * ``sqlite``: the stub is joined;
    * anything else (MariaDB/MySQL, whose ``FOR UPDATE`` would lock joined rows; ``""``): subqueries only,
      the stubs are read afterwards (:func:`load_stubs`).
    """
    same_group_log = and_(
        log.c.message_id == inbox.c.message_id, log.c.consumer_group == inbox.c.consumer_group
    )
    newest_first = (log.c.received_at.desc(), log.c.id.desc())
    budget_clause = {
        Budget.RESEND: inbox.c.resend_count + 1 < max_sends,
        Budget.ANY: true(),
    }[budget]
    row_columns = (
        inbox.c.consumer_group,
        inbox.c.message_id,
        inbox.c.resend_count,
        inbox.c.queue_id,
        inbox.c.queue_offset,
        inbox.c.broker_name,
        inbox.c.resend_topic,
        inbox.c.created_at,
        inbox.c.updated_at,
    )
    if dialect == "postgresql":
        newest = (
            select(log.c.received_at, log.c.reconsume_times, log.c.outcome)
            .where(same_group_log)
            .order_by(*newest_first)
            .limit(1)
            .lateral("newest_delivery")
        )
        stmt = (
            select(
                *row_columns,
                newest.c.received_at.label("last_received_at"),
                newest.c.reconsume_times.label("last_reconsume_times"),
                newest.c.outcome.label("last_outcome"),
            )
            .select_from(inbox.outerjoin(newest, true()))
            .where(or_(newest.c.received_at.is_(None), newest.c.received_at < now - stuck_after))
        )
    else:
        last_received = (
            select(func.max(log.c.received_at, type_=UTCDateTime())).where(same_group_log).scalar_subquery()
        )
        last_reconsume = (
            select(log.c.reconsume_times)
            .where(same_group_log)
            .order_by(*newest_first)
            .limit(1)
            .scalar_subquery()
        )
        last_outcome = (
            select(log.c.outcome).where(same_group_log).order_by(*newest_first).limit(1).scalar_subquery()
        )
        stmt = select(
            *row_columns,
            last_received.label("last_received_at"),
            last_reconsume.label("last_reconsume_times"),
            last_outcome.label("last_outcome"),
        ).where(or_(~exists().where(same_group_log), last_received < now - stuck_after))
    stmt = (
        stmt.where(
            inbox.c.status == status_literal(StubStatus.PENDING),  # the partial index's predicate
            budget_clause,
            inbox.c.resend_at <= now,
        )
        .order_by(inbox.c.resend_at)
        .limit(limit)
        # MariaDB/MySQL may pick a full scan + filesort on a small or freshly loaded table; under
        # FOR UPDATE that locks every row it reads, so a second sweeper's SKIP LOCKED finds nothing. The
        # (status, resend_at) index keeps the scan, and the locks, to the due rows in order.
        .with_hint(inbox, f"FORCE INDEX ({STATUS_RESEND_INDEX})", dialect_name="mysql")
        .with_hint(inbox, f"FORCE INDEX ({STATUS_RESEND_INDEX})", dialect_name="mariadb")
    )
    # a join locks no stub row on PostgreSQL (FOR UPDATE OF) and SQLite (no row locks); MariaDB/MySQL's
    # FOR UPDATE would lock every stub it joins
    return with_stub(stmt) if dialect in ("postgresql", "sqlite") else stmt


#: the stub's columns a candidate carries (:func:`with_stub`, :func:`load_stubs`)
_STUB_COLUMNS = (
    stub.c.message_id,
    stub.c.topic,
    stub.c.tags,
    stub.c.content,
    stub.c.queue_id,
    stub.c.queue_offset,
    stub.c.last_sent_at,
    stub.c.trace_context,
    stub.c.broker_name,
    stub.c.properties,
)


#: the columns of ``due_statement(…)`` and of ``with_stub(due_statement(…))``, in order
#: (:meth:`Candidate.from_rows` unpacks them by position)
SELECTED_KEYS = (
    "consumer_group",
    "message_id",
    "resend_count",
    "queue_id",
    "queue_offset",
    "broker_name",
    "resend_topic",
    "created_at",
    "updated_at",
    "last_received_at",
    "last_reconsume_times",
    "last_outcome",
)
JOINED_KEYS = (*SELECTED_KEYS, *(f"stub_{c.name}" for c in _STUB_COLUMNS))
_SELECTED = len(SELECTED_KEYS)
_NO_STUB: tuple[Any, ...] = (None,) * len(_STUB_COLUMNS)


def with_stub(stmt: Select[Any]) -> Select[Any]:
    """``stmt`` with each row's stub columns (``stub_…``), by a left join on the stub's primary key: one
    statement instead of the selection plus :func:`load_stubs`. Only where the claim's lock clause does not
    lock the joined stub rows (see the module docstring)."""
    labelled = [c.label(f"stub_{c.name}") for c in _STUB_COLUMNS]
    return stmt.add_columns(*labelled).outerjoin_from(inbox, stub, stub.c.message_id == inbox.c.message_id)


def load_stubs(conn: Connection, candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates completed with their stub's topic, body and topic-wide send (one plain SELECT for
    those the claim did not read them for; none when it read them all).

    A row whose stub is missing (deleted, or the row written without a producer) cannot be re-sent — there is
    no body — and is left out here (the sweeper holds it, and gives it up with a notice after
    ``max_unconfirmed_age``: :mod:`.triage`). The guard's own inbox-pattern rows never get here: they have
    no ``resend_at``, so they are never due.
    """
    if all(c.has_stub for c in candidates):
        return list(candidates)
    ids = sorted({c.message_id for c in candidates if not c.has_stub})
    rows = conn.execute(select(*_STUB_COLUMNS).where(stub.c.message_id.in_(ids))).all()
    by_id = {r.message_id: r for r in rows}
    out: list[Candidate] = []
    for c in candidates:
        if c.has_stub:
            out.append(c)
            continue
        r = by_id.get(c.message_id)
        if r is None:
            continue
        out.append(
            replace(
                c,
                topic=r.topic,
                tags=r.tags,
                content=bytes(r.content),
                stub_queue_id=r.queue_id,
                stub_queue_offset=r.queue_offset,
                stub_last_sent_at=r.last_sent_at,
                stub_broker_name=r.broker_name or "",
                trace_context=r.trace_context,
                properties=r.properties,
                has_stub=True,
            )
        )
    return out
