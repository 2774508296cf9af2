"""``reliable stubs list|show|revive|void|retire|prune``: look at messages per consumer group, close what the
sweeper gave up on, and delete what every group settled long ago (:mod:`reliable.outbox.prune`).

A message has one stub (the producer's record) and one inbox row per consumer group that must process it;
``list`` shows one line per (message, group), ``show`` the stub, every group's row, their deliveries and the
notices owed, ``revive`` puts DEAD rows (all groups', or ``--group``'s; with ``--group G --all-dead`` every
DEAD row of the group, in batches) back to PENDING, ``void`` closes open rows without a delivery, ``retire``
voids every open row of a group taken out of service (:mod:`reliable.sweeper.resolve`). The database is
checked first: missing or un-migrated → one line with the hint to run ``reliable db upgrade``.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Engine, case, func, select
from sqlalchemy.orm import Session

from reliable import constants as C
from reliable.cli.common import add_db_options, ready_engine, require_db
from reliable.errors import ConfigurationError, StubNotFoundError
from reliable.models import (
    ConsumeProgress,
    MessageInbox,
    MessageLog,
    MessageStub,
    StubNotification,
    utcnow,
)
from reliable.outbox.prune import prunable, prune_settled
from reliable.settings import Settings
from reliable.sweeper.backoff import parse_duration
from reliable.sweeper.resolve import count_open, retire_group, revive, revive_group, void
from reliable.types import StubStatus

T = TypeVar("T")


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("stubs", help="list, show, revive and void message stubs")
    ssub = p.add_subparsers(dest="stubs_command", metavar="ACTION", required=True)
    ls = ssub.add_parser("list", help="one line per (message, consumer group), newest first")
    ls.add_argument(
        "--status",
        type=str.upper,
        choices=[s.value for s in StubStatus],
        help="only rows of this status (the group's)",
    )
    ls.add_argument("--topic")
    ls.add_argument(
        "--broker-name",
        metavar="NAME",
        help="only rows whose newest copy is on this RocketMQ broker group ('' : rows without one)",
    )
    ls.add_argument("--group")
    ls.add_argument("--limit", type=int, default=50)
    add_db_options(ls)
    ls.set_defaults(func=_list)
    show = ssub.add_parser("show", help="the stub, every group's row, deliveries and owed notices")
    show.add_argument("message_id")
    add_db_options(show)
    show.set_defaults(func=_show)
    rv = ssub.add_parser("revive", help="put DEAD rows back to PENDING (new send budget, due now)")
    rv.add_argument("message_ids", nargs="*", metavar="ID")
    rv.add_argument(
        "--group",
        help="only this group's row (default: every DEAD row of the message); with --all-dead: the group "
        "whose DEAD rows to revive",
    )
    rv.add_argument(
        "--all-dead",
        action="store_true",
        help="every DEAD row of --group instead of IDs "
        f"({C.DEFAULT_REVIVE_BATCH} rows per transaction; --group is required)",
    )
    add_db_options(rv)
    rv.set_defaults(func=_revive)
    vd = ssub.add_parser(
        "void", help="close PENDING/DEAD rows without a delivery (the message must not be processed any more)"
    )
    vd.add_argument("message_ids", nargs="+", metavar="ID")
    vd.add_argument("--group", help="only this group's row; the others go on (default: cancel the message)")
    add_db_options(vd)
    vd.set_defaults(func=_void)
    rt = ssub.add_parser("retire", help="void every open row of a consumer group taken out of service")
    rt.add_argument("group", metavar="GROUP")
    rt.add_argument(
        "--yes", action="store_true", help="do it (without: only say how many rows it would void)"
    )
    add_db_options(rt)
    rt.set_defaults(func=_retire)
    pr = ssub.add_parser(
        "prune", help="delete messages every group settled long ago (stub, inbox rows, notices)"
    )
    pr.add_argument(
        "--older-than",
        required=True,
        metavar="DURATION",
        help="settled before this long ago; longer than the broker keeps messages (a later copy is applied "
        f"again), at least {C.MIN_PRUNE_AGE_S // 86400:.0f} days",
    )
    pr.add_argument("--yes", action="store_true", help="do it (without: only say how many it would delete)")
    add_db_options(pr)
    pr.set_defaults(func=_prune)


def _clip(text: str | None, width: int) -> str:
    if not text:
        return ""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _engine(args: argparse.Namespace) -> Engine:
    """The checked engine; a ``--group`` (``retire GROUP``) that no inbox row has is refused here, before
    anything is read or changed (:func:`check_group`)."""
    engine = ready_engine(require_db(args))
    group = getattr(args, "group", None)
    if group is not None:
        try:
            check_group(engine, group)
        except ConfigurationError:
            engine.dispose()
            raise
    return engine


def check_group(engine: Engine, group: str) -> None:
    """Refuse a consumer group that no inbox row has: a typo. ``stubs retire bilingg --yes`` said "voided 0
    open row(s)", ``list``/``revive``/``void --group`` said nothing matched, and the real group's rows went on
    being re-sent and given up on. The groups named in the line are those with a position
    (``consume_progress``, a small table: listing the inbox's groups would scan it)."""
    with engine.connect() as conn:
        if conn.execute(
            select(MessageInbox.message_id).where(MessageInbox.consumer_group == group).limit(1)
        ).first():
            return
        known = (
            conn.execute(
                select(ConsumeProgress.consumer_group)
                .distinct()
                .order_by(ConsumeProgress.consumer_group)
                .limit(20)
            )
            .scalars()
            .all()
        )
    where = (
        f"groups with a position: {', '.join(known)}" if known else "`reliable stubs list` shows the groups"
    )
    raise ConfigurationError(f"no consumer group {group!r} has a row here (a typo? {where})")


def _list(args: argparse.Namespace) -> int:
    if args.limit <= 0:
        raise ValueError("--limit must be > 0")
    # where the group's newest copy is: a targeted resend's position (on the inbox row), else the producer's
    broker = case(
        (MessageInbox.queue_offset.is_not(None), MessageInbox.broker_name), else_=MessageStub.broker_name
    )
    stmt = (
        select(
            MessageInbox,
            MessageStub.topic,
            MessageStub.queue_id,
            MessageStub.queue_offset,
            broker.label("broker_name"),
        )
        # outer: a group's row whose stub is gone is listed too (the sweeper gives it up, a person is told)
        .outerjoin(MessageStub, MessageStub.message_id == MessageInbox.message_id)
        .order_by(MessageInbox.created_at.desc(), MessageInbox.consumer_group)
        .limit(args.limit)
    )
    if args.status:
        stmt = stmt.where(MessageInbox.status == StubStatus(args.status))
    if args.topic:
        stmt = stmt.where(MessageStub.topic == args.topic)
    if args.group:
        stmt = stmt.where(MessageInbox.consumer_group == args.group)
    if args.broker_name is not None:
        stmt = stmt.where(broker == args.broker_name)
    engine = _engine(args)
    try:
        with Session(engine) as s:
            rows = s.execute(stmt).all()
            # identifiers are never clipped: a person copies them into `stubs revive --group …`
            group_w = max([16, *(len(row.consumer_group) for row, *_ in rows)])
            topic_w = max([16, *(len(topic or "") for _, topic, *_ in rows)])
            print(
                f"{'MESSAGE_ID':<32} {'GROUP':<{group_w}} {'STATUS':<9} {'SENDS':>5} {'TOPIC':<{topic_w}} "
                f"{'BROKER':<12} {'Q':>3} {'OFFSET':>8} {'RESEND_AT':<25} LAST_ERROR"
            )
            for row, topic, stub_q, stub_off, broker_name in rows:
                targeted = row.queue_offset is not None
                q, off = (row.queue_id, row.queue_offset) if targeted else (stub_q, stub_off)
                resend = row.resend_at.isoformat(timespec="seconds") if row.resend_at else "-"
                print(
                    f"{row.message_id:<32} {row.consumer_group:<{group_w}} {row.status.value:<9} "
                    f"{1 + row.resend_count:>5} {topic or '-':<{topic_w}} "
                    f"{_clip(broker_name, 12) or '-':<12} "
                    f"{'' if q is None else q:>3} "
                    f"{'' if off is None else off:>8} {resend:<25} {_clip(row.last_error, 60)}"
                )
            print(f"({len(rows)} row(s))")
    finally:
        engine.dispose()
    return 0


def _value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return f"{len(value)} bytes"
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)


def _show(args: argparse.Namespace) -> int:
    engine = _engine(args)
    try:
        with Session(engine) as s:
            stub = s.get(MessageStub, args.message_id)
            groups = s.scalars(
                select(MessageInbox)
                .where(MessageInbox.message_id == args.message_id)
                .order_by(MessageInbox.consumer_group)
            ).all()
            if stub is None and not groups:
                raise StubNotFoundError(f"no such stub: {args.message_id}")
            if stub is None:
                print(f"message_id      {args.message_id}")
                print("stub            none: deleted, or its group rows were written without a producer")
                print("                (nothing to re-send; stage the message again to have it delivered)")
            else:
                for col in MessageStub.__table__.columns:
                    print(f"{col.key:<15} {_value(getattr(stub, col.key))}")
            for row in groups:
                deliveries = s.execute(
                    select(func.count(), func.max(MessageLog.received_at)).where(
                        MessageLog.message_id == row.message_id,
                        MessageLog.consumer_group == row.consumer_group,
                    )
                ).one()
                last = deliveries[1].isoformat() if deliveries[1] else "-"
                print(f"\ngroup {row.consumer_group}")
                for col in MessageInbox.__table__.columns:
                    if col.key not in ("consumer_group", "message_id", "payload_hash"):
                        print(f"  {col.key:<17} {_value(getattr(row, col.key))}")
                print(f"  {'deliveries':<17} {deliveries[0]} (newest {last})")
            notices = s.scalars(
                select(StubNotification).where(StubNotification.message_id == args.message_id)
            ).all()
            for n in notices:
                state = f"sent {n.notified_at.isoformat()}" if n.notified_at else f"OWED ({n.attempts} tries)"
                print(f"notify {n.consumer_group}/{n.channel}: {state} {_clip(n.last_error or n.reason, 80)}")
    finally:
        engine.dispose()
    return 0


def _on_db(args: argparse.Namespace, action: Callable[[Engine], T]) -> T:
    """``action`` on the command's database; the engine is disposed of whatever happens."""
    engine = _engine(args)
    try:
        return action(engine)
    finally:
        engine.dispose()


def _revive(args: argparse.Namespace) -> int:
    if args.all_dead:
        return _revive_all_dead(args)
    if not args.message_ids:
        raise ConfigurationError(
            "name the message ids to revive (or every DEAD row of one group: --group GROUP --all-dead)"
        )
    count = _on_db(args, lambda e: revive(e, args.message_ids, now=utcnow(), group=args.group))
    print(f"revived {count} row(s): PENDING, send budget reset, due at the next sweep round")
    return 0


def _revive_all_dead(args: argparse.Namespace) -> int:
    """``revive --group G --all-dead``: one group's DEAD rows, never every group's (after an outage that
    would re-send what groups nobody has fixed yet gave up on)."""
    if args.group is None:
        raise ConfigurationError(
            "--all-dead needs --group GROUP: it revives one group's DEAD rows "
            "(`reliable stubs list --status DEAD` shows whose they are)"
        )
    if args.message_ids:
        raise ConfigurationError(
            f"--all-dead revives every DEAD row of group {args.group}: give it no message ids "
            "(or drop --all-dead to revive those ids only)"
        )
    done = _on_db(args, lambda e: revive_group(e, args.group, now=utcnow()))
    print(
        f"revived {done.revived} DEAD row(s) of group {args.group}: PENDING, send budget reset, "
        "due at the next sweep round"
    )
    if done.without_stub:
        print(
            f"left {done.without_stub} DEAD row(s) of group {args.group} as they are: their stub is gone, "
            f"nothing to re-send (stage the message again, or `reliable stubs void ID --group {args.group}`)"
        )
    return 0


def _void(args: argparse.Namespace) -> int:
    count = _on_db(args, lambda e: void(e, args.message_ids, now=utcnow(), group=args.group))
    print(f"voided {count} row(s): no further sends, a delivery is acknowledged without running the handler")
    return 0


def _prune(args: argparse.Namespace) -> int:
    age = parse_duration(args.older_than)
    if not C.MIN_PRUNE_AGE_S <= age <= C.MAX_RETENTION_S:
        raise ConfigurationError(
            f"--older-than {args.older_than}: between {C.MIN_PRUNE_AGE_S // 86400:.0f} days (a copy the "
            "broker still delivers after its message was pruned is applied again) and "
            f"{C.MAX_RETENTION_S // 86400} days"
        )
    retention = Settings.load().log_retention_s
    if age < retention:  # the journal of a pruned message would be an orphan in the report until purged
        raise ConfigurationError(
            f"--older-than {args.older_than}: shorter than the log retention ({retention / 86400:g} days, "
            "RELIABLE_LOG_RETENTION_S); prune only what the log purge has taken the journal of"
        )
    before = utcnow() - dt.timedelta(seconds=age)
    if not args.yes:
        n = _on_db(args, lambda e: prunable(e, before=before))
        print(f"{n} settled message(s) last changed before {before:%Y-%m-%d %H:%M}; run again with --yes")
        return 0
    count = _on_db(args, lambda e: prune_settled(e, before=before))
    print(f"pruned {count} settled message(s): stubs, inbox rows and notices (the journal ages out)")
    return 0


def _retire(args: argparse.Namespace) -> int:
    if not args.yes:
        n = _on_db(args, lambda e: count_open(e, args.group))
        print(f"group {args.group} has {n} open row(s); run again with --yes to void them")
        return 0
    count = _on_db(args, lambda e: retire_group(e, args.group, now=utcnow()))
    print(f"retired group {args.group}: voided {count} open row(s)")
    return 0
