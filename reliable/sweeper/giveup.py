"""Telling a person: a group's row goes DEAD when its sends are spent, or its handler's attempts; and the
never-consumed alarm.

**DEAD** (in the sweeper's record transaction, on rows still carrying its claim): the group's inbox row
``PENDING`` → ``DEAD`` with the reason in ``last_error`` and the stub's status derived (DESIGN.md §1: some
group's resends exhausted → ``DEAD``); the log line at once (the always-on channel) and its
``stub_notification`` row, written delivered, for that ``(message_id, consumer_group)`` — so in a fan-out
each group that gave up is reported once, and a group that did receive the message (or confirmed it while
the sweeper asked the broker) is not. That row is the notice: every sweeper owes it on its own channels
(:mod:`.owed`), whichever sweeper gave the row up.

**DEAD by the guard** (:func:`tell_unreported`): a handler that failed ``max_attempts`` times makes the guard
dead-letter the delivery and set the group's row ``DEAD`` itself, in its settle transaction — the guard has
no notification channels. Every round, the sweeper finds the DEAD rows with no notice row at all and tells
a person about them exactly as about its own: the log line and the delivered ``log`` row. Several sweepers
skip each other's locked rows. A DEAD row given up by a sweeper of before 2026-11-28 (a database upgraded
from revision 0007 or older) has rows for the channels that sweeper had and no ``log`` row: it gets its
``log`` row as of the time it was told — no log line, not counted as a new death — so the channels of today
owe it (:mod:`.owed` owes a notice through its ``log`` row only), and the channels that told it keep their
rows (nobody is told twice on one channel).

**Never consumed**: a group has rows on a queue it has no watermark on, and the broker has the message
there. Re-sending would put another copy on a queue nobody of that group reads, so the sweeper holds those
rows and raises an alarm instead: the ``reliable_sweeper_never_consumed`` metric, one ERROR log line and one
notice — once per ``(group, topic, broker group, queue)``, not once per row or per round, with a text of its
own (:mod:`.notices`: it is not a give-up). The notice is its marker row (``~never:`` + the queue, on the
``log`` channel, written delivered), owed on the channels like any other: it used to lie on a waiting
message's key, and that message's give-up, revive or void deleted the owed alarm while the marker stayed,
so it was never raised again.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, exists, insert, select
from sqlalchemy.exc import IntegrityError

from reliable import constants as C
from reliable import outbox
from reliable.models import status_literal
from reliable.stores import LeaseState
from reliable.sweeper import metrics
from reliable.sweeper.claim import lock_mode, locking
from reliable.sweeper.leases import FREE, LeaseView
from reliable.sweeper.notices import (
    NEVER_CONSUMED_TAG,
    QUEUE_TAGS,
    DeadNotice,
    QueueRef,
    never_consumed_marker,
    queue_tag,
)
from reliable.sweeper.notify import log_dead
from reliable.sweeper.owed import Key, delete_rows, forget, keys_in, told_rows
from reliable.sweeper.selection import Candidate, inbox, notif, stub
from reliable.sweeper.verdict import Facts, Verdict
from reliable.types import StubStatus

log = logging.getLogger("reliable.sweeper")

__all__ = [
    "NEVER_CONSUMED_TAG",
    "NO_STUB",
    "give_up_reason",
    "mark_dead",
    "never_consumed_key",
    "no_stub_reason",
    "raise_never_consumed",
    "tell_unreported",
]

#: why a row whose ``message_stub`` is gone (deleted by hand, or an inbox row written without a producer)
#: is held: there is no body to re-send
NO_STUB = "no message_stub row: nothing to re-send"


#: what a person must do about a lease key without a TTL before a revive can help
ENDLESS_LEASE = (
    "its Redis lease key holds a 'processing:' value without a TTL (not the guard's: it always sets one), "
    "and every delivery is refused (lease_conflict) while it is there: delete the key, then revive"
)


UNKNOWN_LEASE = (
    "Redis could not be read, so whether a worker holds its lease is unknown (the guard decides on the "
    "database alone meanwhile): see why it was not confirmed, then revive"
)


def give_up_reason(
    cand: Candidate,
    verdict: Verdict,
    facts: Facts,
    topic: str,
    max_sends: int,
    max_age: dt.timedelta,
    lease: LeaseView = FREE,
) -> str:
    """What a person reads about a row that went DEAD. ``lease``: what Redis said of its lease — a key
    without a TTL, or Redis unreadable, held the row until the last resort
    (:func:`reliable.sweeper.leases.defers_resend`), and the person must know which."""
    spent = f"after {cand.sends} send(s) (budget {max_sends})"
    if verdict is Verdict.STUCK:
        assert cand.last_received_at is not None
        unknown = lease.state is LeaseState.UNAVAILABLE
        why = ENDLESS_LEASE if lease.endless else UNKNOWN_LEASE if unknown else "no live worker lease"
        return (
            f"received but never confirmed {spent}; newest delivery {cand.last_received_at.isoformat()} "
            f"and {why}"
        )
    return _never_received_reason(cand, verdict, facts, topic, spent, max_age) + (
        f"; {ENDLESS_LEASE}" if lease.endless else ""
    )


def _never_received_reason(
    cand: Candidate, verdict: Verdict, facts: Facts, topic: str, spent: str, max_age: dt.timedelta
) -> str:
    if verdict is Verdict.NEVER_SENT:
        return f"no send reached the broker {spent}"
    on = f" of {cand.broker_name}" if cand.broker_name else ""
    where = f"last copy at {topic} queue {cand.queue_id}{on} offset {cand.queue_offset}"
    if verdict is Verdict.LOST:
        return f"never received {spent}: {where}, and the broker's max offset there is {facts.broker_max}"
    if verdict is Verdict.EXPIRED:
        return (
            f"never received {spent}: {where}, below the broker's min offset there ({facts.broker_min}): "
            "deleted by the broker's retention before the group read it"
        )
    if verdict is Verdict.TOO_OLD:
        return f"never received {spent}: {where}, unconfirmed for longer than {max_age}"
    return f"never received {spent}: {where}, group watermark {facts.watermark}"


def no_stub_reason(cand: Candidate, max_age: dt.timedelta) -> str:
    """What a person reads about a row given up because its stub is gone."""
    return (
        f"{NO_STUB}; unconfirmed since {cand.created_at.isoformat()}, longer than {max_age} (revive cannot "
        "help: stage the message again)"
    )


def mark_dead(
    conn: Connection,
    dead: Sequence[tuple[Candidate, str]],
    *,
    now: dt.datetime,
) -> list[DeadNotice]:
    """Set the rows DEAD with their reasons (:func:`reliable.outbox.mark_dead_rows`: only a row still
    ``PENDING``, so a confirmation that slipped in stands; the stub's status is derived) and record the
    notices owed for the rows it set DEAD (returned)."""
    changed = outbox.mark_dead_rows(
        conn, [(c.message_id, c.consumer_group, "DEAD: " + reason) for c, reason in dead], now
    )
    # a row no longer PENDING was not given up: no notice, not counted
    dead = [(cand, reason) for cand, reason in dead if (cand.message_id, cand.consumer_group) in changed]
    if not dead:
        return []
    keys = [(c.message_id, c.consumer_group) for c, _ in dead]
    forget(conn, keys)  # rows of an earlier death of the same (message, group) (revived since) would collide
    notices = [
        DeadNotice(
            message_id=cand.message_id,
            topic=cand.topic,
            consumer_group=cand.consumer_group,
            send_count=cand.sends,
            queue_id=cand.queue_id,
            queue_offset=cand.queue_offset,
            reason=reason,
            dead_at=now.isoformat(),
            broker_name=cand.broker_name,
        )
        for cand, reason in dead
    ]
    _tell(conn, notices, now)
    return notices


def tell_unreported(conn: Connection, *, now: dt.datetime, limit: int) -> list[DeadNotice]:
    """Tell a person about up to ``limit`` DEAD rows nobody was told about (the guard's, see the module
    docstring); returns their notices. Locks the rows it reads (``SKIP LOCKED`` where the server has it)."""
    # a give-up's notice; a queue-level alarm on the same key (a never-consumed alarm raised before
    # migration 0010 lies on a waiting message's key) is not one: a person must hear of the give-up too
    give_up = (
        notif.c.message_id == inbox.c.message_id,
        notif.c.consumer_group == inbox.c.consumer_group,
        *(~notif.c.reason.startswith(f"{tag} ", autoescape=True) for tag in QUEUE_TAGS),
    )
    stmt = (
        select(
            inbox.c.consumer_group,
            inbox.c.message_id,
            inbox.c.resend_count,
            inbox.c.queue_id,
            inbox.c.queue_offset,
            inbox.c.broker_name,
            inbox.c.last_error,
            inbox.c.updated_at,
            # told on some channel by a sweeper of before the log row (see the module doc)
            exists().where(*give_up).label("told_then"),
        )
        .where(
            inbox.c.status == status_literal(StubStatus.DEAD),
            ~exists().where(*give_up, notif.c.channel == C.NOTIFY_CHANNEL_LOG),
        )
        .order_by(inbox.c.consumer_group, inbox.c.message_id)
        .limit(limit)
    )
    found = conn.execute(locking(stmt, lock_mode(conn))).all()
    _log_row_of_told(conn, [(r.message_id, r.consumer_group) for r in found if r.told_then], now)
    rows = [r for r in found if not r.told_then]
    if not rows:
        return []
    stubs = {
        r.message_id: r
        for r in conn.execute(
            select(
                stub.c.message_id, stub.c.topic, stub.c.queue_id, stub.c.queue_offset, stub.c.broker_name
            ).where(stub.c.message_id.in_(sorted({r.message_id for r in rows})))
        )
    }
    notices = []
    for r in rows:
        s = stubs.get(r.message_id)
        pos = s if s is not None and r.queue_offset is None else r  # where the group's newest copy is
        reason = (r.last_error or "DEAD (no reason recorded)").removeprefix("DEAD: ")
        notices.append(
            DeadNotice(
                message_id=r.message_id,
                topic=s.topic if s is not None else "",
                consumer_group=r.consumer_group,
                send_count=1 + int(r.resend_count or 0),
                queue_id=pos.queue_id,
                queue_offset=pos.queue_offset,
                reason=reason,
                dead_at=r.updated_at.isoformat(),
                broker_name=pos.broker_name or "",
            )
        )
    # an alarm's rows on those keys (before 0010) would collide with the notices' (one per key and channel)
    forget(conn, [(n.message_id, n.consumer_group) for n in notices])
    _tell(conn, notices, now)
    return notices


def _log_row_of_told(conn: Connection, keys: Sequence[Key], now: dt.datetime) -> None:
    """The delivered ``log`` row of give-ups a sweeper of before 2026-11-28 told on its channels only: the
    reason and time of the key's oldest such row; its channels' rows stay as they are. A ``log`` row on the
    key can only be an alarm's of before migration 0010 (it would collide): deleted, by primary key after a
    plain read, as :func:`~reliable.sweeper.owed.forget` does."""
    if not keys:
        return
    found = conn.execute(
        select(notif.c.message_id, notif.c.consumer_group, notif.c.channel, notif.c.reason)
        .add_columns(notif.c.created_at)
        .where(keys_in(conn, keys))
        .order_by(notif.c.created_at, notif.c.channel)
    ).all()
    delete_rows(
        conn,
        [(r.message_id, r.consumer_group, r.channel) for r in found if r.channel == C.NOTIFY_CHANNEL_LOG],
    )
    alarm = tuple(f"{tag} " for tag in QUEUE_TAGS)
    told: dict[Key, Any] = {}
    for r in found:
        if r.channel != C.NOTIFY_CHANNEL_LOG and not r.reason.startswith(alarm):
            told.setdefault((r.message_id, r.consumer_group), r)
    rows = told_rows(list(told), [r.reason for r in told.values()], now)
    for row, first in zip(rows, told.values(), strict=True):
        row["created_at"] = row["notified_at"] = first.created_at  # told back then
    if rows:
        conn.execute(insert(notif), rows)


def _tell(conn: Connection, notices: Sequence[DeadNotice], now: dt.datetime) -> None:
    """The log line of each notice now and its ``log`` row, written delivered (the channels owe it later)."""
    keys = [(n.message_id, n.consumer_group) for n in notices]
    conn.execute(insert(notif), told_rows(keys, [n.reason for n in notices], now))
    for notice in notices:
        log_dead(notice)


def never_consumed_key(topic: str, queue_id: int | None, broker_name: str = "") -> str:
    """The start of a never-consumed reason (how a person, and the dedupe query, recognise one alarm): the
    queue's tag (:func:`.notices.queue_tag`), per (topic, broker group, queue); without a broker group the
    form written before migration 0006, so an alarm raised then is still recognised."""
    return queue_tag(NEVER_CONSUMED_TAG, QueueRef(topic, queue_id, broker_name))


def raise_never_consumed(
    conn: Connection,
    found: Sequence[tuple[Candidate, str, Facts]],
    *,
    now: dt.datetime,
) -> int:
    """Count the rows in the metric and raise each new ``(group, topic, broker group, queue)`` alarm once;
    returns how many alarms were raised now."""
    queues: dict[tuple[str, str, str, int | None], list[tuple[Candidate, Facts]]] = {}
    for cand, topic, facts in found:
        queue = (cand.consumer_group, topic, cand.broker_name, cand.queue_id)
        queues.setdefault(queue, []).append((cand, facts))
        metrics.NEVER_CONSUMED.labels(cand.consumer_group, topic, cand.broker_name, str(cand.queue_id)).inc()
    raised = 0
    for (group, topic, broker_name, queue_id), rows in queues.items():
        prefix = never_consumed_key(topic, queue_id, broker_name)
        if _raised_before(conn, group, prefix):
            continue
        first, facts = rows[0]
        reason = _never_consumed_reason(prefix, group, topic, queue_id, facts, len(rows), first.message_id)
        if not _claim_alarm(conn, QueueRef(topic, queue_id, broker_name), group, reason, now):
            continue
        log.error("never-consumed alarm: %s", reason)
        raised += 1
    return raised


def _never_consumed_reason(
    prefix: str, group: str, topic: str, queue_id: int | None, facts: Facts, seen: int, example: str
) -> str:
    """What the never-consumed alarm tells a person (``prefix``: the alarm's key)."""
    if queue_id == C.UNKNOWN_QUEUE_ID:
        return (
            f"{prefix} group {group} has never consumed {topic} (no consume_progress row on any of its "
            f"queues) and owes messages sent there through a broker that does not say which queue "
            f"(RocketMQ 5.x) — {seen} seen in this round, e.g. {example}. The group is not subscribed to "
            f"{topic}, or its consumers never started: subscribe or start it. They are held, not re-sent "
            "(a resend to the shared topic reaches every group), until the group has consumed the topic."
        )
    held = (
        f"the broker holds messages there (max offset {facts.broker_max})"
        if facts.broker_max is not None
        else "messages were sent there (no broker probe answer: RabbitMQ has none)"
    )
    return (
        f"{prefix} group {group} has never consumed this queue (no consume_progress row) but {held} "
        f"that the group owes — {seen} seen "
        f"in this round, e.g. {example}. Either the group is not subscribed to {topic} (or its "
        "consumers never started): subscribe it; or it started after them from the queue's end "
        "(CONSUME_FROM_LAST_OFFSET, an offset reset) and the broker will not deliver them. They are "
        "held, not re-sent, until max_unconfirmed_age after their send; then each is re-sent to the "
        "group where a resend reaches it alone (not on a shared Kafka or RocketMQ 5.x topic)."
    )


def _raised_before(conn: Connection, group: str, prefix: str) -> bool:
    """Whether a log row of this alarm exists (its marker, or — raised before the marker — a message's)."""
    pattern = prefix.replace("%", r"\%").replace("_", r"\_") + "%"
    row = conn.execute(
        select(notif.c.message_id)
        .where(
            notif.c.consumer_group == group,
            notif.c.channel == C.NOTIFY_CHANNEL_LOG,
            notif.c.reason.like(pattern, escape="\\"),
        )
        .limit(1)
    ).first()
    return row is not None


def _claim_alarm(conn: Connection, queue: QueueRef, group: str, reason: str, now: dt.datetime) -> bool:
    """Write the alarm's marker row (the notice: on the log channel, written delivered); ``False`` when
    another sweeper's claim, running at the same time, wrote it first. Its primary key is the arbiter: the
    second insert waits for the first transaction and then meets its row (a savepoint keeps this
    transaction usable)."""
    marker = [(never_consumed_marker(queue), group)]
    try:
        with conn.begin_nested():
            conn.execute(insert(notif), told_rows(marker, [reason], now))
    except IntegrityError:
        log.info("never-consumed alarm of %s on %s already raised by another sweeper", group, queue)
        return False
    return True
