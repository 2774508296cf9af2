"""The owed-notice bookkeeping in ``stub_notification``: what is told, what each channel still owes, claims.

**Told.** Giving a row up, a guard's dead-letter found, a never-consumed alarm or a stall raised writes ONE
row, on the ``log`` channel and already delivered (:func:`told_rows`): the log line goes out at once, and
that row *is* the notice — the same whichever sweeper wrote it and whatever channels it has.

**Owed.** Each sweeper owes the notices on its own channels (:func:`owe`): a told notice with no row for
one of them gets an owed row (``notified_at`` NULL) there. Who hears of a give-up therefore no longer
depends on which sweeper gave the row up: one started without its e-mail settings (a missing env file)
used to write rows for no channel, and nobody was ever e-mailed. A channel added later is owed every
notice still told (rows still DEAD, alarms still open). Queue-level notices count only on their own keys
(``~stall:``, ``~never:``; notices.py): never-consumed alarms of before migration 0010 lie on a message's
key too. A Redis outage (``~redis:leases``, :mod:`.redis_outage`) counts only once told: while it is only
watched (``REDIS_WATCH``, shorter than ``stuck_after``) its row keeps its start and is owed nowhere.

**Claimed.** Delivery (:mod:`.notify`) claims a batch of owed rows in a short transaction
(:func:`claim`: ``claimed_until`` moves ahead, ``SKIP LOCKED`` where the server has it, so sweepers take
different rows), calls the channel with no transaction open, and records the outcome in a second short
transaction (:func:`settle`) on the rows still carrying that claim. No lock is held across the network
call: on MariaDB the locking read's gap locks held up other sweepers' give-ups — and with them the
consumers waiting on those give-ups' inbox rows — for as long as the mail server took. A sweeper killed
mid-delivery leaves its rows owed; they are claimed again when the claim ends (at-least-once per channel).
On MariaDB these transactions run at ``READ COMMITTED`` (no gap locks).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    FromClause,
    and_,
    case,
    cast,
    delete,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite

from reliable import constants as C
from reliable.outbox.keys import columns_in
from reliable.sweeper.claim import LockMode, lock_mode
from reliable.sweeper.notices import QUEUE_TAGS, DeadNotice, NoticeKind, RedisPhase, parse_tag
from reliable.sweeper.selection import inbox, notif, stub

#: a ``stub_notification`` key: (message_id, consumer_group)
Key = tuple[str, str]


def keys_in(conn: Connection, keys: Sequence[Key], table: FromClause = notif) -> ColumnElement[bool]:
    """The ``table`` (``stub_notification``) rows of these ``(message_id, consumer_group)`` keys
    (:func:`reliable.outbox.keys.columns_in`: an OR of 500 pairs took SQLAlchemy ~30 ms to build and
    compile, four times per batch)."""
    return columns_in(conn, table.c.message_id, table.c.consumer_group, keys)


def told_rows(keys: Sequence[Key], reasons: Sequence[str], now: dt.datetime) -> list[dict[str, Any]]:
    """The ``log`` rows of notices told now (written delivered: the log line goes out with them)."""
    return [
        {
            "message_id": m,
            "consumer_group": g,
            "channel": C.NOTIFY_CHANNEL_LOG,
            "reason": r,
            "created_at": now,
            "notified_at": now,
            "attempts": 0,
        }
        for (m, g), r in zip(keys, reasons, strict=True)
    ]


def forget(conn: Connection, keys: Sequence[Key]) -> None:
    """Delete every row of these keys (an earlier death's, revived since; an alarm of before migration 0010)
    by primary key, after a plain read: a ``DELETE`` whose condition matched nothing took a gap lock at
    MariaDB's REPEATABLE READ, and two sweepers telling different rows at once deadlocked on their inserts."""
    found = conn.execute(
        select(notif.c.message_id, notif.c.consumer_group, notif.c.channel).where(keys_in(conn, keys))
    )
    delete_rows(conn, [(m, g, c) for m, g, c in found])


def delete_rows(conn: Connection, rows: Sequence[tuple[str, str, str]]) -> None:
    """Delete these ``(message_id, consumer_group, channel)`` rows by primary key (rows a plain read found:
    see :func:`forget`)."""
    if rows:
        conn.execute(
            delete(notif).where(
                or_(
                    *(
                        and_(notif.c.message_id == m, notif.c.consumer_group == g, notif.c.channel == c)
                        for m, g, c in rows
                    )
                )
            )
        )


@contextmanager
def _short(engine: Engine) -> Iterator[Connection]:
    """A short transaction; on MariaDB at READ COMMITTED: the owed-row scans take no gap locks, so a give-up
    inserting its row meanwhile never waits for them."""
    with engine.begin() as conn:
        if conn.dialect.name in ("mysql", "mariadb"):
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        yield conn


def _told_notices(told: FromClause) -> ColumnElement[bool]:
    """``told``'s rows that are notices: the ``log`` row of a give-up, or of an alarm on its own key — not
    a Redis outage still watched (:mod:`.redis_outage`: told to nobody until it lasts ``stuck_after``)."""
    own_key = or_(
        told.c.message_id.startswith(C.STALL_KEY_PREFIX, autoescape=True),
        told.c.message_id.startswith(C.NEVER_CONSUMED_KEY_PREFIX, autoescape=True),
        told.c.message_id == C.REDIS_OUTAGE_KEY,
    )
    give_up = and_(*(~told.c.reason.startswith(f"{tag} ", autoescape=True) for tag in QUEUE_TAGS))
    watched = told.c.reason.startswith(f"{RedisPhase.WATCHING.value} ", autoescape=True)
    return and_(told.c.channel == C.NOTIFY_CHANNEL_LOG, ~watched, or_(own_key, give_up))


def owe(engine: Engine, channel: str, *, batch: int) -> int:
    """Owe on ``channel`` every told notice that has no row there yet; returns how many rows were added.

    Per batch: the missing keys are read without a lock, then inserted from their ``log`` row in one
    statement (a notice revived or cleared meanwhile has none any more: nothing is owed for it), skipping a
    key another sweeper owed first."""
    told = notif.alias("told")
    there = exists().where(
        notif.c.message_id == told.c.message_id,
        notif.c.consumer_group == told.c.consumer_group,
        notif.c.channel == channel,
    )
    missing = select(told.c.message_id, told.c.consumer_group).where(_told_notices(told), ~there).limit(batch)
    cols = ["message_id", "consumer_group", "channel", "reason", "created_at", "attempts"]
    added = 0
    while True:
        with _short(engine) as conn:
            keys = [(m, g) for m, g in conn.execute(missing)]
            if keys:
                rows = select(
                    told.c.message_id,
                    told.c.consumer_group,
                    cast(literal(channel), notif.c.channel.type).label("channel"),
                    told.c.reason,
                    told.c.created_at,  # owed since the notice was raised
                    literal_column("0").label("attempts"),
                ).where(told.c.channel == C.NOTIFY_CHANNEL_LOG, keys_in(conn, keys, told))
                conn.execute(_insert_new(conn).from_select(cols, rows))
        added += len(keys)
        if len(keys) < batch:
            return added


def _insert_new(conn: Connection) -> Any:
    """An ``INSERT`` into ``stub_notification`` that skips a key already there."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(notif).on_conflict_do_nothing()
    if conn.dialect.name == "sqlite":
        return sqlite.insert(notif).on_conflict_do_nothing()
    stmt = mysql.insert(notif)
    return stmt.on_duplicate_key_update(channel=stmt.inserted.channel)


@dataclass(frozen=True, slots=True)
class Claimed:
    """An owed row claimed for delivery: its notice, failed deliveries so far, and since when it is owed."""

    notice: DeadNotice
    attempts: int
    owed_since: dt.datetime

    @property
    def key(self) -> Key:
        return (self.notice.message_id, self.notice.consumer_group)


def claim(engine: Engine, channel: str, *, now: dt.datetime, until: dt.datetime, batch: int) -> list[Claimed]:
    """Claim up to ``batch`` of ``channel``'s owed rows that nobody is delivering, the least-tried first,
    then the oldest (a row that keeps failing sorts behind fresh ones), until ``until``."""
    owed = (
        select(
            notif.c.message_id, notif.c.consumer_group, notif.c.reason, notif.c.created_at, notif.c.attempts
        )
        .where(
            notif.c.channel == channel,
            notif.c.notified_at.is_(None),
            or_(notif.c.claimed_until.is_(None), notif.c.claimed_until <= now),
        )
        .order_by(notif.c.attempts, notif.c.created_at)
        .limit(batch)
    )
    with _short(engine) as conn:
        mode = lock_mode(conn)
        if mode is LockMode.SKIP_LOCKED:
            owed = owed.with_for_update(skip_locked=True)
        elif mode is LockMode.BLOCKING:
            owed = owed.with_for_update()
        rows = conn.execute(owed).all()
        if not rows:
            return []
        keys = [(r.message_id, r.consumer_group) for r in rows]
        conn.execute(
            update(notif).where(notif.c.channel == channel, keys_in(conn, keys)).values(claimed_until=until)
        )
        where_are = _positions(conn, channel, keys)
    return [
        Claimed(_notice(r, where_are.get((r.message_id, r.consumer_group))), r.attempts, r.created_at)
        for r in rows
    ]


def settle(
    engine: Engine,
    channel: str,
    keys: Sequence[Key],
    *,
    until: dt.datetime,
    now: dt.datetime,
    error: str | None,
) -> None:
    """Record a delivery of ``keys`` on ``channel`` (``error``: it failed, they stay owed) on the rows still
    carrying the claim ``until`` (a claim that ran out and was taken again is the other sweeper's now)."""
    done = {"notified_at": now, "last_error": None} if error is None else {"last_error": error[:2000]}
    with _short(engine) as conn:
        conn.execute(
            update(notif)
            .where(notif.c.channel == channel, keys_in(conn, keys), notif.c.claimed_until == until)
            .values(attempts=notif.c.attempts + 1, claimed_until=None, **done)
        )


@dataclass(frozen=True, slots=True)
class Owed:
    """What one channel owes (every channel with owed rows, configured here or not)."""

    channel: str
    count: int
    oldest: dt.datetime
    most_attempts: int


def owed_by_channel(engine: Engine) -> list[Owed]:
    """Per channel: how many notices are owed, the oldest since when, the most failed deliveries of one."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(notif.c.channel, func.count(), func.min(notif.c.created_at), func.max(notif.c.attempts))
            .where(notif.c.notified_at.is_(None))
            .group_by(notif.c.channel)
            .order_by(notif.c.channel)
        ).all()
    return [Owed(channel, int(n), oldest, int(most or 0)) for channel, n, oldest, most in rows]


def _positions(conn: Connection, channel: str, keys: Sequence[Key]) -> dict[Key, Any]:
    """Where each owed notice's message is (its topic, the group's newest copy), read without a lock:
    MariaDB has no ``FOR UPDATE OF``, and a lock here held the message's stub and inbox rows."""
    group_row = and_(
        inbox.c.message_id == notif.c.message_id, inbox.c.consumer_group == notif.c.consumer_group
    )
    stmt = (
        select(
            notif.c.message_id,
            notif.c.consumer_group,
            stub.c.topic,
            inbox.c.resend_count,
            func.coalesce(inbox.c.queue_id, stub.c.queue_id).label("queue_id"),
            func.coalesce(inbox.c.queue_offset, stub.c.queue_offset).label("queue_offset"),
            # the newest copy's broker group: a targeted resend's (on the inbox row), else the producer's
            case((inbox.c.queue_offset.is_not(None), inbox.c.broker_name), else_=stub.c.broker_name).label(
                "broker_name"
            ),
        )
        # outer joins: a queue-level notice's rows are keyed by their queue, not by a message (notices.py)
        .select_from(
            notif.outerjoin(stub, stub.c.message_id == notif.c.message_id).outerjoin(inbox, group_row)
        )
        .where(notif.c.channel == channel, keys_in(conn, keys))
    )
    return {(r.message_id, r.consumer_group): r for r in conn.execute(stmt)}


def _notice(r: Any, at: Any) -> DeadNotice:
    """A notice from an owed row (``at``: its message's position, :func:`_positions`): its kind from the
    reason's tag, a queue-level row's topic and queue too."""
    if r.message_id == C.REDIS_OUTAGE_KEY:  # about no message, queue or group
        return DeadNotice(
            message_id=r.message_id,
            topic="",
            consumer_group=r.consumer_group,
            send_count=0,
            queue_id=None,
            queue_offset=None,
            reason=r.reason,
            dead_at=r.created_at.isoformat(),
            kind=NoticeKind.REDIS_UNREADABLE,
        )
    tag = parse_tag(r.reason)
    return DeadNotice(
        message_id=r.message_id,
        topic=tag.queue.topic if tag is not None else ((at.topic if at is not None else None) or ""),
        consumer_group=r.consumer_group,
        send_count=0 if tag is not None else 1 + int((at.resend_count if at is not None else 0) or 0),
        queue_id=tag.queue.queue_id if tag is not None else (at.queue_id if at is not None else None),
        queue_offset=tag.watermark if tag is not None else (at.queue_offset if at is not None else None),
        reason=r.reason,
        dead_at=r.created_at.isoformat(),
        kind=NoticeKind.DEAD if tag is None else tag.kind,
        broker_name=tag.queue.broker_name
        if tag is not None
        else ((at.broker_name if at is not None else "") or ""),
    )
