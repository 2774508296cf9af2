"""The one owner of every ``message_stub`` / ``message_inbox`` write outside the guard's hot path.

Why one module: the producer's first send and the sweeper's resends record the same facts (a send count, where
the copy landed, when the row is due again), and reviving, voiding and giving up each touch a stub *and* its
inbox rows. Written once here, the two tables cannot drift apart. The guard's own confirm/claim statements
stay in :mod:`reliable.stores.sql` (they are the hot path, hand-rendered per dialect).

API (every function runs inside the caller's transaction; none commits)::

    stage(session, message_id, topic, body, groups=..., tags=None, now=..., resend_at=...) -> payload hash
        the stub PENDING + one PENDING inbox row per group (DuplicateMessageIdError if the id exists)
    attempt_send(sender, message) -> SendAttempt          any exception = not accepted (logged, never raised)
    record_sends(conn, [(attempt, resend_at), ...], now)  a topic send → the stub (and the due time of its
        PENDING inbox rows); a targeted send (message.target_group) → that group's inbox row, whose
        ``attempts`` a landed copy resets
    derive_status(conn, message_ids, now)                 the stub's status from its inbox rows
    settle(conn, now) -> int                              PENDING stubs whose groups all confirmed → CONFIRMED
    settle_slice(conn, now, after, limit) -> cursor       the same for the next `limit` PENDING stubs
    mark_dead(conn, message_id, group, now, error)        one group gave up → inbox DEAD, stub derived
    revive(conn, message_id, now, group=None) -> int      DEAD inbox rows → PENDING, attempts and resends 0
    void(conn, message_id, now) -> int                    stub and open inbox rows → VOIDED

Stub status (DESIGN.md §1): ``VOIDED`` stays; any inbox row ``DEAD`` → ``DEAD``; every row ``CONFIRMED`` (or
voided) → ``CONFIRMED``; otherwise ``PENDING``. The guard keeps it current in the transaction that confirms
the last group (exactly, also when two groups confirm at once: see ``SqlStore.settle_exact``). :func:`settle`
repairs stubs left behind by other writers (a person's SQL, an older version); the sweeper runs it a slice
per round (:func:`settle_slice`), so a round's cost does not grow with the number of PENDING stubs.

Lock order: every function here that writes both tables writes the inbox rows first, then the stub, and
several rows of one table in message id order — the order the guard takes them in (inbox rows locked by
``SELECT … FOR UPDATE … ORDER BY message_id``, then the stubs it settles) — so a producer recording a send
while a consumer confirms cannot deadlock (tests/core/test_producer_concurrency.py lines the two up).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Table,
    and_,
    bindparam,
    case,
    exists,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session

from reliable.errors import DuplicateMessageIdError
from reliable.models import MessageInbox, MessageStub, status_literal
from reliable.sender import OutgoingMessage, Sender, SendReceipt
from reliable.types import StubStatus

log = logging.getLogger("reliable.outbox")

stub = cast(Table, MessageStub.__table__)
inbox = cast(Table, MessageInbox.__table__)

_ERROR_MAX = 2000
_OPEN = (StubStatus.PENDING, StubStatus.DEAD)


def payload_hash(body: bytes) -> str:
    """SHA-256 hex of a body: what the guard compares to refuse a different body under the same id."""
    return hashlib.sha256(body).hexdigest()


def stage(
    session: Session,
    message_id: str,
    topic: str,
    body: bytes,
    *,
    groups: Sequence[str],
    tags: str | None,
    now: dt.datetime,
    resend_at: dt.datetime,
    trace_context: str | None = None,
) -> str:
    """Add the PENDING stub and one PENDING inbox row per group to ``session``; returns the payload hash."""
    if session.get(MessageStub, message_id) is not None:
        raise DuplicateMessageIdError(f"a stub with message id {message_id!r} already exists")
    digest = payload_hash(body)
    session.add(
        MessageStub(
            message_id=message_id,
            topic=topic,
            tags=tags,
            content=body,
            payload_hash=digest,
            status=StubStatus.PENDING,
            send_count=0,
            resend_at=resend_at,
            created_at=now,
            updated_at=now,
            trace_context=trace_context,
        )
    )
    for group in dict.fromkeys(groups):
        session.add(
            MessageInbox(
                consumer_group=group,
                message_id=message_id,
                status=StubStatus.PENDING,
                attempts=0,
                payload_hash=digest,
                resend_count=0,
                resend_at=resend_at,
                created_at=now,
                updated_at=now,
            )
        )
    return digest


@dataclass(frozen=True, slots=True)
class SendAttempt:
    """One hand-over to a broker: ``receipt`` when accepted, else ``error`` (the reason, bounded)."""

    message: OutgoingMessage
    receipt: SendReceipt | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.receipt is not None


def attempt_send(sender: Sender, message: OutgoingMessage) -> SendAttempt:
    """``sender.send(message)``; any exception means "not accepted" and is returned, logged, not raised."""
    try:
        return SendAttempt(message, receipt=sender.send(message))
    except Exception as exc:  # the Sender contract: any failure = not accepted; recorded on the row
        error = f"{type(exc).__name__}: {exc}"[:_ERROR_MAX]
        target = f" for group {message.target_group}" if message.target_group else ""
        log.warning("send of %s%s failed: %s", message.message_id, target, error)
        return SendAttempt(message, error=error)


def record_sends(
    conn: Connection, attempts: Sequence[tuple[SendAttempt, dt.datetime]], now: dt.datetime
) -> None:
    """Record send attempts (each with the time its row is due again) in at most four executemany calls —
    on PostgreSQL the targeted sends in one set-based statement (a sweeper batch's hundreds of rows).

    A topic send: stub ``send_count + 1``, ``last_sent_at``, ``resend_at``; landed → its broker group, queue
    and offset and ``last_error`` cleared, failed → ``last_error``; the message's PENDING inbox rows take the
    same due time. A targeted send: that group's inbox row ``resend_count + 1`` and ``resend_at``; landed →
    its broker group, queue and offset (the retry topic's), ``last_error`` cleared and ``attempts`` reset to
    0; failed → ``last_error``. No status filter: a consumer may have confirmed meanwhile; the send history
    still belongs to the row.
    """
    topic_ok: list[dict[str, Any]] = []
    topic_failed: list[dict[str, Any]] = []
    group_ok: list[dict[str, Any]] = []
    group_failed: list[dict[str, Any]] = []
    for a, due in attempts:
        m = a.message
        row: dict[str, Any] = {
            "b_mid": m.message_id,
            "b_due": due,
            "b_err": a.error,
            "b_group": m.target_group,
            "b_ok": a.ok,
        }
        if a.receipt is not None:
            row.update(
                b_qid=a.receipt.queue_id, b_qoff=a.receipt.queue_offset, b_broker=a.receipt.broker_name
            )
        if m.target_group is None:
            (topic_ok if a.ok else topic_failed).append(row)
        else:
            (group_ok if a.ok else group_failed).append(row)
    # Lock order, as the guard takes its locks: inbox rows before stubs, and within each table in message id
    # order (the guard's ``SELECT … FOR UPDATE … ORDER BY message_id``). executemany runs the rows in list
    # order, so staging order (b, a) against a guard batch holding a and asking for b would deadlock.
    for rows in (topic_ok, topic_failed, group_ok, group_failed):
        rows.sort(key=_lock_order)
    if topic_ok or topic_failed:
        conn.execute(
            update(inbox)
            .where(inbox.c.message_id == bindparam("b_mid"), inbox.c.status == StubStatus.PENDING)
            .values(resend_at=bindparam("b_due"), updated_at=now),
            sorted(topic_ok + topic_failed, key=_lock_order),
        )
    by_id = stub.c.message_id == bindparam("b_mid")
    sent = {
        "send_count": stub.c.send_count + 1,
        "last_sent_at": now,
        "updated_at": now,
        "resend_at": bindparam("b_due"),
    }
    if topic_ok:
        conn.execute(
            update(stub)
            .where(by_id)
            .values(
                queue_id=bindparam("b_qid"),
                queue_offset=bindparam("b_qoff"),
                broker_name=bindparam("b_broker"),
                last_error=None,
                **sent,
            ),
            topic_ok,
        )
    if topic_failed:
        conn.execute(update(stub).where(by_id).values(last_error=bindparam("b_err"), **sent), topic_failed)
    if conn.dialect.name == "postgresql" and (group_ok or group_failed):
        _record_group_sends_pg(conn, sorted(group_ok + group_failed, key=_lock_order), now)
        return
    mine = and_(inbox.c.message_id == bindparam("b_mid"), inbox.c.consumer_group == bindparam("b_group"))
    resent = {"resend_count": inbox.c.resend_count + 1, "resend_at": bindparam("b_due"), "updated_at": now}
    if group_ok:
        conn.execute(
            update(inbox)
            .where(mine)
            .values(
                queue_id=bindparam("b_qid"),
                queue_offset=bindparam("b_qoff"),
                broker_name=bindparam("b_broker"),
                last_error=None,
                attempts=0,
                **resent,
            ),
            group_ok,
        )
    if group_failed:
        conn.execute(update(inbox).where(mine).values(last_error=bindparam("b_err"), **resent), group_failed)


#: every targeted send of a batch in one statement, the rows as one JSON document (what ``executemany``
#: costs per row — a statement, its parameters, its reply — is most of a sweeper batch; a JSON text is
#: cheaper to build than eight arrays). ``v`` takes the row locks in the guard's order first (a ``SELECT …
#: ORDER BY … FOR UPDATE`` locks as it emits rows; the UPDATE's own join order is the planner's) and is the
#: only row source the UPDATE joins, so even a generic plan is one index probe per row. A failed send
#: (``ok`` false) keeps its row's last landed position.
_GROUP_SENDS_PG = text(
    """
WITH v AS (
    SELECT v.* FROM json_to_recordset(CAST(:rows AS json)) AS v(
        consumer_group varchar, message_id varchar, ok boolean, due timestamptz, qid integer, qoff bigint,
        broker varchar, err text)
    JOIN message_inbox AS i USING (consumer_group, message_id)
    ORDER BY i.message_id, i.consumer_group FOR UPDATE OF i
)
UPDATE message_inbox AS i SET
    resend_count = i.resend_count + 1, resend_at = v.due, updated_at = :now, last_error = v.err,
    queue_id = CASE WHEN v.ok THEN v.qid ELSE i.queue_id END,
    queue_offset = CASE WHEN v.ok THEN v.qoff ELSE i.queue_offset END,
    broker_name = CASE WHEN v.ok THEN v.broker ELSE i.broker_name END,
    attempts = CASE WHEN v.ok THEN 0 ELSE i.attempts END
FROM v WHERE i.consumer_group = v.consumer_group AND i.message_id = v.message_id
"""
)


def _record_group_sends_pg(conn: Connection, rows: Sequence[Mapping[str, Any]], now: dt.datetime) -> None:
    """The targeted sends of ``rows`` (``record_sends``' rows, in lock order) in one statement."""
    doc = [
        {
            "consumer_group": r["b_group"],
            "message_id": r["b_mid"],
            "ok": r["b_ok"],
            "due": r["b_due"].isoformat(),
            "qid": r.get("b_qid"),
            "qoff": r.get("b_qoff"),
            "broker": r.get("b_broker"),
            "err": r["b_err"],
        }
        for r in rows
    ]
    conn.execute(_GROUP_SENDS_PG, {"rows": json.dumps(doc), "now": now})


def _lock_order(row: Mapping[str, Any]) -> tuple[str, str]:
    """Rows of one executemany sorted by (message id, group): the order the guard locks them in."""
    return (row["b_mid"], row["b_group"] or "")


def _derived(now: dt.datetime) -> dict[str, Any]:
    """SET clause: the stub's status from its inbox rows (callers filter stubs that have inbox rows)."""
    of_stub = inbox.c.message_id == stub.c.message_id
    dead = exists().where(of_stub, inbox.c.status == StubStatus.DEAD)
    open_ = exists().where(of_stub, inbox.c.status.in_(_OPEN))
    status = case(
        (dead, StubStatus.DEAD.value), (open_, StubStatus.PENDING.value), else_=StubStatus.CONFIRMED.value
    )
    confirmed_at = case((~open_, func.coalesce(stub.c.confirmed_at, now)), else_=None)
    return {"status": status, "confirmed_at": confirmed_at, "updated_at": now}


def derive_status(conn: Connection, message_ids: Sequence[str], now: dt.datetime) -> None:
    """Set each stub's status from its inbox rows (a voided stub or one without inbox rows stays as is)."""
    if not message_ids:
        return
    conn.execute(
        update(stub)
        .where(
            stub.c.message_id.in_(list(message_ids)),
            stub.c.status != StubStatus.VOIDED,
            exists().where(inbox.c.message_id == stub.c.message_id),
        )
        .values(**_derived(now))
    )


def settle(conn: Connection, now: dt.datetime) -> int:
    """PENDING stubs whose every group confirmed (concurrent last confirms both missed it) → CONFIRMED.

    Looks at every PENDING stub: its cost grows with them. The sweeper walks them in slices instead
    (:func:`settle_slice`)."""
    return _settle_where(conn, now, stub.c.status == status_literal(StubStatus.PENDING))


#: where a :func:`settle_slice` walk stopped: the last stub's (resend_at, message_id); ``None``: the start
SettleCursor = tuple[dt.datetime, str] | None


def settle_slice(conn: Connection, now: dt.datetime, after: SettleCursor, limit: int) -> SettleCursor:
    """:func:`settle` for the next ``limit`` PENDING stubs in ``(resend_at, message_id)`` order after
    ``after``: an ordered range scan of ``ix_message_stub_status_resend_at`` that stops at ``limit``, so a
    sweep round's cost does not grow with the table. Returns where to go on (``None``: the walk reached
    the end and starts over). A PENDING stub without ``resend_at`` (not staged by the producer) is left out.
    """
    q = select(stub.c.resend_at, stub.c.message_id).where(
        stub.c.status == status_literal(StubStatus.PENDING), stub.c.resend_at.is_not(None)
    )
    if after is not None:
        q = q.where(
            or_(
                stub.c.resend_at > after[0],
                and_(stub.c.resend_at == after[0], stub.c.message_id > after[1]),
            )
        )
    rows = conn.execute(q.order_by(stub.c.resend_at, stub.c.message_id).limit(limit)).all()
    if rows:
        _settle_where(
            conn, now, and_(stub.c.status == StubStatus.PENDING, stub.c.message_id.in_([r[1] for r in rows]))
        )
    if len(rows) < limit:
        return None
    return rows[-1][0], rows[-1][1]


def _settle_where(conn: Connection, now: dt.datetime, which: ColumnElement[bool]) -> int:
    of_stub = inbox.c.message_id == stub.c.message_id
    result = conn.execute(
        update(stub)
        .where(
            which,
            exists().where(of_stub),
            ~exists().where(of_stub, inbox.c.status.in_(_OPEN)),
        )
        .values(status=StubStatus.CONFIRMED.value, confirmed_at=now, updated_at=now)
    )
    return int(result.rowcount)


def mark_dead(conn: Connection, message_id: str, group: str, now: dt.datetime, error: str | None) -> bool:
    """Group ``group`` gave up on ``message_id`` (resends exhausted): its PENDING inbox row → DEAD."""
    result = conn.execute(
        update(inbox)
        .where(
            inbox.c.message_id == message_id,
            inbox.c.consumer_group == group,
            inbox.c.status == StubStatus.PENDING,
        )
        .values(status=StubStatus.DEAD.value, resend_at=None, updated_at=now, last_error=error)
    )
    derive_status(conn, [message_id], now)
    return bool(result.rowcount)


def revive(conn: Connection, message_id: str, now: dt.datetime, group: str | None = None) -> int:
    """DEAD inbox rows of ``message_id`` (one group's or all) → PENDING, due now, attempts and resends 0."""
    cond = [inbox.c.message_id == message_id, inbox.c.status == StubStatus.DEAD]
    if group is not None:
        cond.append(inbox.c.consumer_group == group)
    result = conn.execute(
        update(inbox)
        .where(*cond)
        .values(
            status=StubStatus.PENDING.value,
            attempts=0,
            resend_count=0,
            resend_at=now,
            last_error=None,
            updated_at=now,
        )
    )
    derive_status(conn, [message_id], now)
    return int(result.rowcount)


def void(conn: Connection, message_id: str, now: dt.datetime) -> int:
    """Cancel a message: a PENDING/DEAD stub and its open inbox rows → VOIDED; returns stubs changed (0/1)."""
    conn.execute(  # inbox rows first: the guard's lock order
        update(inbox)
        .where(inbox.c.message_id == message_id, inbox.c.status.in_(_OPEN))
        .values(status=StubStatus.VOIDED, resend_at=None, updated_at=now)
    )
    result = conn.execute(
        update(stub)
        .where(stub.c.message_id == message_id, stub.c.status.in_(_OPEN))
        .values(status=StubStatus.VOIDED, resend_at=None, updated_at=now)
    )
    return int(result.rowcount)


def stub_status(conn: Connection, message_id: str) -> StubStatus | None:
    """The stub's status, ``None`` when there is no stub."""
    value = conn.execute(select(stub.c.status).where(stub.c.message_id == message_id)).scalar()
    return None if value is None else StubStatus(value)
