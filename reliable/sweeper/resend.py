"""Re-sending claimed stubs through the producer's :class:`reliable.sender.Sender`, and giving up on them.

After a successful resend (PostgreSQL: one ``UPDATE … FROM unnest(arrays)`` per batch; elsewhere one
executemany)::

    send_count   += 1
    queue_id, queue_offset = the receipt's          (where this copy landed: the next round compares it
                                                     with the consumer watermark of that queue)
    last_sent_at  = now
    resend_at     = now + backoff(send_count) + backlog estimate
    last_error    = NULL

A failed send (the sender raised — any exception means "not accepted", see reliable/sender.py) counts as an
attempt, like the producer's own failed first send: ``send_count += 1``, ``last_error`` = the reason,
``resend_at = now + backoff(send_count)`` with no backlog estimate (nothing was queued), and
``queue_id/queue_offset/last_sent_at`` keep describing the last copy that did land. Counting failures keeps a
permanently broken route (unknown topic, revoked credentials) from retrying forever in silence: it spends
the budget and ends DEAD, which tells a person.

The status is never changed here: a consumer may confirm the stub while the broker call is in flight, and
that confirmation must stand.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, bindparam, delete, insert, or_, select, text, tuple_, update

from reliable.otel.propagation import carrier_from_json
from reliable.sender import OutgoingMessage, Sender, SendReceipt
from reliable.sweeper.backoff import BacklogEstimator, BackoffPolicy, QueueProgress
from reliable.sweeper.leases import LeaseState, LeaseView
from reliable.sweeper.notify import Channel, DeadNotice, log_dead, notification_rows
from reliable.sweeper.selection import Candidate, notif, progress, stub
from reliable.types import StubStatus

log = logging.getLogger("reliable.sweeper")


#: a property on every resent copy, so a consumer (or a person reading the broker) can tell it is a resend.
RESEND_PROPERTY = "RELIABLE_RESEND"


@dataclass
class BatchResult:
    resent: int = 0
    send_failures: int = 0
    stuck_recovered: int = 0
    lease_held: int = 0  # stuck stubs left alone: a live worker holds the lease
    lease_unknown: int = 0  # stuck stubs postponed: Redis did not answer
    dead: list[DeadNotice] = field(default_factory=list)


#: (consumer_group, topic, queue_id) of a ``consume_progress`` row
ProgressKey = tuple[str, str, int]


def load_progress(conn: Connection, candidates: Sequence[Candidate]) -> dict[ProgressKey, QueueProgress]:
    """The ``consume_progress`` rows behind the batch's queues (one statement), for the backlog estimate."""
    keys = {(c.consumer_group, c.topic, c.queue_id) for c in candidates if c.queue_id is not None}
    if not keys:
        return {}
    key_cols = tuple_(progress.c.consumer_group, progress.c.topic, progress.c.queue_id)
    if conn.dialect.name == "sqlite":  # row-value IN works on SQLite >= 3.15 but not through every driver
        clause = or_(
            *[
                (progress.c.consumer_group == g) & (progress.c.topic == t) & (progress.c.queue_id == q)
                for g, t, q in keys
            ]
        )
    else:
        clause = key_cols.in_(list(keys))
    rows = conn.execute(select(progress).where(clause)).all()
    return {
        (r.consumer_group, r.topic, r.queue_id): QueueProgress(
            r.max_offset, r.min_offset, r.created_at, r.updated_at, r.received_count
        )
        for r in rows
    }


def send_claimed(
    recorder: Callable[[], AbstractContextManager[Connection]],
    sender: Sender,
    candidates: Sequence[Candidate],
    leases: Sequence[LeaseView],
    *,
    policy: BackoffPolicy,
    estimator: BacklogEstimator,
    clock: Callable[[], dt.datetime],
    lease_unknown_hold: dt.timedelta,
    should_stop: Callable[[], bool] = lambda: False,
) -> BatchResult:
    """Send each claimed stub (skipping stuck ones a live worker holds), then record all outcomes at once.

    ``leases[i]`` belongs to ``candidates[i]`` (FREE for stubs that were never received). ``recorder()``
    gives the connection the outcomes are written on: the claiming transaction itself (row-lock claims) or
    a new one (lease claims, see :mod:`reliable.sweeper.claim`). A stop request between sends leaves the
    rest unsent and unchanged: due again in the next round (row locks) or after the claim TTL (leases).
    """
    result = BatchResult()
    ok: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    postponed: list[dict[str, Any]] = []
    sent: list[tuple[Candidate, SendReceipt | None, str | None]] = []
    for cand, lease in zip(candidates, leases, strict=True):
        if lease.state is LeaseState.LIVE:
            result.lease_held += 1
            hold = lease.remaining or lease_unknown_hold
            postponed.append({"b_id": cand.message_id, "b_resend_at": clock() + hold})
            continue
        if lease.state is LeaseState.UNKNOWN:
            result.lease_unknown += 1
            postponed.append({"b_id": cand.message_id, "b_resend_at": clock() + lease_unknown_hold})
            continue
        if should_stop():
            break
        message = OutgoingMessage(
            message_id=cand.message_id,
            topic=cand.topic,
            body=cand.content,
            consumer_group=cand.consumer_group,
            tags=cand.tags,
            send_count=cand.send_count,
            properties={**carrier_from_json(cand.trace_context), RESEND_PROPERTY: str(cand.send_count)},
        )
        try:
            receipt: SendReceipt | None = sender.send(message)
            error = None
        except Exception as exc:  # the Sender contract: any exception = not accepted; recorded, counted
            receipt, error = None, f"resend {cand.send_count} failed: {type(exc).__name__}: {exc}"[:2000]
            log.warning("resend of %s failed: %s", cand.message_id, error)
        sent.append((cand, receipt, error))

    with recorder() as conn:
        queues = load_progress(conn, [c for c, r, _ in sent if r is not None])
        for cand, receipt, error in sent:
            now = clock()
            count = cand.send_count + 1
            if receipt is None:
                result.send_failures += 1
                failed.append(
                    {
                        "b_id": cand.message_id,
                        "b_send_count": count,
                        "b_resend_at": now + policy.delay(count),
                        "b_last_error": error,
                    }
                )
                continue
            result.resent += 1
            if cand.stuck:
                result.stuck_recovered += 1
            backlog = estimator.estimate(
                queues.get((cand.consumer_group, cand.topic, receipt.queue_id)),
                cand.topic,
                receipt.queue_id,
                receipt.queue_offset,
            )
            ok.append(
                {
                    "b_id": cand.message_id,
                    "b_send_count": count,
                    "b_queue_id": receipt.queue_id,
                    "b_queue_offset": receipt.queue_offset,
                    "b_last_sent_at": now,
                    "b_resend_at": now + policy.delay(count) + backlog,
                    "b_last_error": None,
                }
            )
        if ok and conn.dialect.name == "postgresql":
            conn.execute(_PG_RECORD, _pg_arrays(ok, clock()))
        elif ok:
            conn.execute(
                update(stub)
                .where(stub.c.message_id == bindparam("b_id"))
                .values(
                    send_count=bindparam("b_send_count"),
                    queue_id=bindparam("b_queue_id"),
                    queue_offset=bindparam("b_queue_offset"),
                    last_sent_at=bindparam("b_last_sent_at", type_=stub.c.last_sent_at.type),
                    resend_at=bindparam("b_resend_at", type_=stub.c.resend_at.type),
                    last_error=bindparam("b_last_error"),
                ),
                ok,
            )
        if failed:
            conn.execute(
                update(stub)
                .where(stub.c.message_id == bindparam("b_id"))
                .values(
                    send_count=bindparam("b_send_count"),
                    resend_at=bindparam("b_resend_at", type_=stub.c.resend_at.type),
                    last_error=bindparam("b_last_error"),
                ),
                failed,
            )
        if postponed:
            conn.execute(
                update(stub)
                .where(stub.c.message_id == bindparam("b_id"))
                .values(resend_at=bindparam("b_resend_at", type_=stub.c.resend_at.type)),
                postponed,
            )
    return result


#: PostgreSQL: the batch's outcomes in ONE statement (arrays unnested into rows) instead of one UPDATE per
#: stub: a tenth of the round trips and of the Python work per row (bench c1 measures both forms).
_PG_RECORD = text(
    """
    UPDATE message_stub AS s
       SET send_count = v.send_count, queue_id = v.queue_id, queue_offset = v.queue_offset,
           last_sent_at = v.sent_at, resend_at = v.resend_at, last_error = NULL, updated_at = :now
      FROM unnest(CAST(:ids AS varchar[]), CAST(:counts AS integer[]), CAST(:queue_ids AS integer[]),
                  CAST(:offsets AS bigint[]), CAST(:sent AS timestamptz[]), CAST(:resend AS timestamptz[]))
           AS v(message_id, send_count, queue_id, queue_offset, sent_at, resend_at)
     WHERE s.message_id = v.message_id
    """
)


def _pg_arrays(rows: Sequence[dict[str, Any]], now: dt.datetime) -> dict[str, Any]:
    return {
        "ids": [r["b_id"] for r in rows],
        "counts": [r["b_send_count"] for r in rows],
        "queue_ids": [r["b_queue_id"] for r in rows],
        "offsets": [r["b_queue_offset"] for r in rows],
        "sent": [r["b_last_sent_at"] for r in rows],
        "resend": [r["b_resend_at"] for r in rows],
        "now": now,
    }


def _key(c: Candidate) -> ProgressKey:
    return (c.consumer_group, c.topic, c.queue_id if c.queue_id is not None else -1)


def give_up_reason(cand: Candidate, max_sends: int, queue: QueueProgress | None = None) -> str:
    if cand.stuck:
        assert cand.last_received_at is not None
        return (
            f"received but never confirmed after {cand.send_count} send(s) (budget {max_sends}); newest "
            f"delivery {cand.last_received_at.isoformat()} and no live worker lease"
        )
    if cand.queue_offset is None:
        return f"no send reached the broker after {cand.send_count} attempt(s) (budget {max_sends})"
    return (
        f"never received after {cand.send_count} send(s) (budget {max_sends}): last copy at queue "
        f"{cand.queue_id} offset {cand.queue_offset}, group watermark "
        f"{queue.max_offset if queue is not None else cand.watermark}"
    )


def mark_dead(
    conn: Connection,
    candidates: Sequence[Candidate],
    leases: Sequence[LeaseView],
    *,
    max_sends: int,
    channels: Sequence[Channel],
    now: dt.datetime,
    lease_unknown_hold: dt.timedelta,
) -> BatchResult:
    """In the claiming transaction: set DEAD (with the reason in ``last_error``) and record what is owed.

    The ``status='PENDING'`` guard keeps a confirmation that slipped in from being overwritten (rows are
    locked on PostgreSQL/MariaDB, so this only matters on backends without row locks).
    """
    result = BatchResult()
    dead: list[Candidate] = []
    for cand, lease in zip(candidates, leases, strict=True):
        if lease.state is LeaseState.FREE:
            dead.append(cand)
            continue
        if lease.state is LeaseState.LIVE:
            result.lease_held += 1
        else:
            result.lease_unknown += 1
        hold = lease.remaining or lease_unknown_hold
        conn.execute(update(stub).where(stub.c.message_id == cand.message_id).values(resend_at=now + hold))
    if not dead:
        return result
    queues = load_progress(conn, dead)
    reasons = [give_up_reason(c, max_sends, queues.get(_key(c))) for c in dead]
    conn.execute(
        update(stub)
        .where(stub.c.message_id == bindparam("b_id"), stub.c.status == StubStatus.PENDING)
        .values(status=StubStatus.DEAD, last_error=bindparam("b_reason")),
        [{"b_id": c.message_id, "b_reason": "DEAD: " + r} for c, r in zip(dead, reasons, strict=True)],
    )
    rows = notification_rows([c.message_id for c in dead], reasons, channels, now)
    if rows:
        # rows of an earlier life of the same id (a stub deleted and written again) would collide
        conn.execute(delete(notif).where(notif.c.message_id.in_([c.message_id for c in dead])))
        conn.execute(insert(notif), rows)
    for cand, reason in zip(dead, reasons, strict=True):
        notice = DeadNotice(
            message_id=cand.message_id,
            topic=cand.topic,
            consumer_group=cand.consumer_group,
            send_count=cand.send_count,
            queue_id=cand.queue_id,
            queue_offset=cand.queue_offset,
            reason=reason,
            dead_at=now.isoformat(),
        )
        log_dead(notice)
        result.dead.append(notice)
    return result
