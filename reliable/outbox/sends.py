"""Send attempts and their records: a topic send moves the stub, a targeted send (one group's resend) that
group's inbox row; both in the guard's lock order."""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, bindparam, case, select, text, update

from reliable.outbox.keys import by_primary_key
from reliable.outbox.tables import inbox, stub
from reliable.sender import OutgoingMessage, Sender, SendReceipt
from reliable.types import StubStatus

log = logging.getLogger("reliable.outbox")

_ERROR_MAX = 2000


@dataclass(frozen=True, slots=True)
class SendAttempt:
    """One hand-over to a broker: ``receipt`` when accepted, else ``error`` (the reason, bounded)."""

    message: OutgoingMessage
    receipt: SendReceipt | None = None
    error: str | None = None
    #: the topic a targeted copy went to (the sender's route: ``%RETRY%{group}``, or the message's own);
    #: recorded on the group's inbox row as ``resend_topic``. ``None``: not known (recorded as unknown)
    topic: str | None = None

    @property
    def ok(self) -> bool:
        return self.receipt is not None


def attempt_send(sender: Sender, message: OutgoingMessage, topic: str | None = None) -> SendAttempt:
    """``sender.send(message)``; any exception means "not accepted" and is returned, logged, not raised.
    ``topic``: where a targeted copy goes (:attr:`SendAttempt.topic`)."""
    try:
        return SendAttempt(message, receipt=sender.send(message), topic=topic)
    except Exception as exc:  # the Sender contract: any failure = not accepted; recorded on the row
        error = f"{type(exc).__name__}: {exc}"[:_ERROR_MAX]
        target = f" for group {message.target_group}" if message.target_group else ""
        log.warning("send of %s%s failed: %s", message.message_id, target, error)
        return SendAttempt(message, error=error, topic=topic)


def record_sends(
    conn: Connection,
    attempts: Sequence[tuple[SendAttempt, dt.datetime]],
    now: dt.datetime,
    *,
    claimed_until: dt.datetime | None = None,
) -> None:
    """Record send attempts (each with the time its row is due again) in at most four executemany calls —
    on PostgreSQL the targeted sends in one set-based statement (a sweeper batch's hundreds of rows).

    A topic send: stub ``send_count + 1``, ``last_sent_at``, ``resend_at``; landed → its broker group, queue
    and offset and ``last_error`` cleared, failed → ``last_error``; the message's PENDING inbox rows take the
    same due time. A targeted send: that group's inbox row ``resend_count + 1`` and ``resend_at``; landed →
    its topic (``resend_topic``, the attempt's ``topic``: ``%RETRY%{group}`` or the message's own; ``NULL``
    when the attempt does not know it), broker group, queue and offset, ``last_error`` cleared and
    ``attempts`` reset to 0; failed → ``last_error``, the last landed copy's position and topic kept. No
    status filter: a consumer may have confirmed meanwhile; the send history still belongs to the row.

    ``claimed_until``: the targeted sends were claimed by moving their rows' ``resend_at`` there (the
    sweeper's claim, :mod:`reliable.sweeper.claim`) and sent with no row lock held. Only a row still
    ``PENDING`` and still carrying that claim takes the send's ``resend_at``, ``last_error`` and
    ``attempts``; on any other row — confirmed, voided or given up meanwhile, or claimed again by another
    sweeper after this claim ended — the send is history only (``resend_count + 1`` and, landed, where the
    copy is: the report attributes the duplicate it causes), so a confirmation that landed during the send
    stands and keeps no error.
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
            if m.target_group is not None:
                row["b_topic"] = a.topic
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
        _topic_sends_due(conn, sorted(topic_ok + topic_failed, key=_lock_order), now)
    # where a landed copy is: the same columns on the stub (a topic send) and on the inbox row (targeted)
    landed: dict[str, Any] = {
        "queue_id": bindparam("b_qid"),
        "queue_offset": bindparam("b_qoff"),
        "broker_name": bindparam("b_broker"),
        "last_error": None,
    }
    by_id = stub.c.message_id == bindparam("b_mid")
    sent = {
        "send_count": stub.c.send_count + 1,
        "last_sent_at": now,
        "updated_at": now,
        "resend_at": bindparam("b_due"),
    }
    if topic_ok:
        conn.execute(update(stub).where(by_id).values(**landed, **sent), topic_ok)
    if topic_failed:
        conn.execute(update(stub).where(by_id).values(last_error=bindparam("b_err"), **sent), topic_failed)
    if conn.dialect.name == "postgresql" and (group_ok or group_failed):
        _record_group_sends_pg(conn, sorted(group_ok + group_failed, key=_lock_order), now, claimed_until)
        return
    mine = and_(inbox.c.message_id == bindparam("b_mid"), inbox.c.consumer_group == bindparam("b_group"))
    # by primary key on MariaDB, as the guard locks its row (reliable.outbox.keys.by_primary_key)
    one_row = by_primary_key(update(inbox).where(mine), inbox)
    # a landed targeted copy: its topic too (a copy of unknown topic overwrites the old one with NULL)
    landed_topic = bindparam("b_topic", type_=inbox.c.resend_topic.type)
    if claimed_until is None:
        resent = {
            "resend_count": inbox.c.resend_count + 1,
            "resend_at": bindparam("b_due"),
            "updated_at": now,
        }
        if group_ok:
            conn.execute(one_row.values(**landed, resend_topic=landed_topic, attempts=0, **resent), group_ok)
        if group_failed:
            conn.execute(one_row.values(last_error=bindparam("b_err"), **resent), group_failed)
        return
    # still ours: PENDING and carrying the claim (else the send is history only, see the docstring)
    ours = and_(inbox.c.status == StubStatus.PENDING, inbox.c.resend_at == claimed_until)

    def if_ours(value: Any, column: Any) -> Any:
        return case((ours, value), else_=column)

    # MariaDB/MySQL assign left to right, later assignments seeing earlier ones: ``resend_at``, which
    # ``ours`` reads, is assigned last (ordered_values; SQLAlchemy would use the table's column order)
    count = (inbox.c.resend_count, inbox.c.resend_count + 1)
    due_at = (inbox.c.resend_at, if_ours(bindparam("b_due", type_=inbox.c.resend_at.type), inbox.c.resend_at))
    if group_ok:
        position = [(inbox.c[name], value) for name, value in landed.items() if name != "last_error"]
        conn.execute(
            one_row.ordered_values(
                count,
                (inbox.c.updated_at, now),
                *position,
                (inbox.c.resend_topic, landed_topic),
                (inbox.c.last_error, if_ours(None, inbox.c.last_error)),
                (inbox.c.attempts, if_ours(0, inbox.c.attempts)),
                due_at,
            ),
            group_ok,
        )
    if group_failed:
        error = if_ours(bindparam("b_err", type_=inbox.c.last_error.type), inbox.c.last_error)
        conn.execute(
            one_row.ordered_values(count, (inbox.c.updated_at, now), (inbox.c.last_error, error), due_at),
            group_failed,
        )


#: every targeted send of a batch in one statement, the rows as one JSON document (what ``executemany``
#: costs per row — a statement, its parameters, its reply — is most of a sweeper batch; a JSON text is
#: cheaper to build than eight arrays). ``v`` takes the row locks in the guard's order first (a ``SELECT …
#: ORDER BY … FOR UPDATE`` locks as it emits rows; the UPDATE's own join order is the planner's) and is the
#: only row source the UPDATE joins, so even a generic plan is one index probe per row. A failed send
#: (``ok`` false) keeps its row's last landed position. ``own``: the row is still PENDING and carries the
#: sweeper's claim (``:claimed_until``; NULL: no claim to check), else the send is history only — read
#: under the row lock ``v`` takes (a row changed meanwhile is read in its newest version).
_GROUP_SENDS_PG = text(
    """
WITH v AS (
    SELECT v.*, (CAST(:claimed_until AS timestamptz) IS NULL
        OR (i.status = 'PENDING' AND i.resend_at = CAST(:claimed_until AS timestamptz))) AS own
    FROM json_to_recordset(CAST(:rows AS json)) AS v(
        consumer_group varchar, message_id varchar, ok boolean, due timestamptz, qid integer, qoff bigint,
        broker varchar, topic varchar, err text)
    JOIN message_inbox AS i USING (consumer_group, message_id)
    ORDER BY i.message_id, i.consumer_group FOR UPDATE OF i
)
UPDATE message_inbox AS i SET
    resend_count = i.resend_count + 1, updated_at = :now,
    resend_at = CASE WHEN v.own THEN v.due ELSE i.resend_at END,
    last_error = CASE WHEN v.own THEN v.err ELSE i.last_error END,
    queue_id = CASE WHEN v.ok THEN v.qid ELSE i.queue_id END,
    queue_offset = CASE WHEN v.ok THEN v.qoff ELSE i.queue_offset END,
    broker_name = CASE WHEN v.ok THEN v.broker ELSE i.broker_name END,
    resend_topic = CASE WHEN v.ok THEN v.topic ELSE i.resend_topic END,
    attempts = CASE WHEN v.ok AND v.own THEN 0 ELSE i.attempts END
FROM v WHERE i.consumer_group = v.consumer_group AND i.message_id = v.message_id
"""
)


def _record_group_sends_pg(
    conn: Connection, rows: Sequence[Mapping[str, Any]], now: dt.datetime, claimed_until: dt.datetime | None
) -> None:
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
            "topic": r.get("b_topic"),
            "err": r["b_err"],
        }
        for r in rows
    ]
    conn.execute(_GROUP_SENDS_PG, {"rows": json.dumps(doc), "now": now, "claimed_until": claimed_until})


def _topic_sends_due(conn: Connection, rows: Sequence[Mapping[str, Any]], now: dt.datetime) -> None:
    """Every PENDING inbox row of the topic sends' messages takes its send's due time.

    The rows are found by message id alone, which only the ``(message_id, status)`` index answers. On
    MariaDB/MySQL an ``UPDATE`` reading through it locked each row's entry there, then the row: the reverse
    of a guard confirming one of the rows (the row by primary key, then the entry its status change moves),
    and the two deadlocked (tests/sweeper/test_inbox_pk_lock_order.py). There the keys are read first
    without a lock, then the rows updated by primary key (:func:`reliable.outbox.keys.by_primary_key`),
    still only while PENDING. At READ COMMITTED the one-statement form did not lock a row that turned
    PENDING after it either; one that does between the read and the update keeps its own due time.
    """
    by_mid = update(inbox).where(
        inbox.c.message_id == bindparam("b_mid"), inbox.c.status == StubStatus.PENDING
    )
    if conn.dialect.name not in ("mysql", "mariadb"):
        conn.execute(by_mid.values(resend_at=bindparam("b_due"), updated_at=now), list(rows))
        return
    due = {r["b_mid"]: r["b_due"] for r in rows}
    found = conn.execute(
        select(inbox.c.message_id, inbox.c.consumer_group).where(
            inbox.c.message_id.in_(sorted(due)), inbox.c.status == StubStatus.PENDING
        )
    )
    keys = sorted((m, g) for m, g in found)
    if not keys:
        return
    one_row = and_(
        inbox.c.message_id == bindparam("b_mid"),
        inbox.c.consumer_group == bindparam("b_group"),
        inbox.c.status == StubStatus.PENDING,
    )
    conn.execute(
        by_primary_key(update(inbox).where(one_row), inbox).values(
            resend_at=bindparam("b_due"), updated_at=now
        ),
        [{"b_mid": m, "b_group": g, "b_due": due[m]} for m, g in keys],
    )


def _lock_order(row: Mapping[str, Any]) -> tuple[str, str]:
    """Rows of one executemany sorted by (message id, group): the order the guard locks them in."""
    return (row["b_mid"], row["b_group"] or "")
