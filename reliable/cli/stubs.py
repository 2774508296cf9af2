"""``reliable stubs list|show|revive``: look at message stubs and put DEAD ones back to PENDING."""

from __future__ import annotations

import argparse
from typing import Any

from sqlalchemy import func, select

from reliable.cli.common import add_db_options, require_db
from reliable.errors import StubNotFoundError
from reliable.facade import make_engine
from reliable.models import MessageLog, MessageStub, StubNotification, utcnow
from reliable.sweeper.retention import revive
from reliable.types import StubStatus


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("stubs", help="list, show and revive message stubs")
    ssub = p.add_subparsers(dest="stubs_command", metavar="ACTION", required=True)
    ls = ssub.add_parser("list", help="list stubs (newest first)")
    ls.add_argument(
        "--status", type=str.upper, choices=[s.value for s in StubStatus], help="only this status"
    )
    ls.add_argument("--topic")
    ls.add_argument("--group")
    ls.add_argument("--limit", type=int, default=50)
    add_db_options(ls)
    ls.set_defaults(func=_list)
    show = ssub.add_parser("show", help="every column of one stub, its deliveries and owed notices")
    show.add_argument("message_id")
    add_db_options(show)
    show.set_defaults(func=_show)
    rv = ssub.add_parser("revive", help="put DEAD stubs back to PENDING (new send budget, due now)")
    rv.add_argument("message_ids", nargs="+", metavar="ID")
    add_db_options(rv)
    rv.set_defaults(func=_revive)


def _clip(text: str | None, width: int) -> str:
    if not text:
        return ""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _list(args: argparse.Namespace) -> int:
    if args.limit <= 0:
        raise ValueError("--limit must be > 0")
    engine = make_engine(require_db(args))
    stmt = select(MessageStub).order_by(MessageStub.created_at.desc()).limit(args.limit)
    if args.status:
        stmt = stmt.where(MessageStub.status == StubStatus(args.status))
    if args.topic:
        stmt = stmt.where(MessageStub.topic == args.topic)
    if args.group:
        stmt = stmt.where(MessageStub.consumer_group == args.group)
    try:
        from sqlalchemy.orm import Session

        with Session(engine) as s:
            rows = s.scalars(stmt).all()
            print(
                f"{'MESSAGE_ID':<32} {'STATUS':<9} {'SENDS':>5} {'TOPIC':<16} {'GROUP':<16} {'Q':>3} "
                f"{'OFFSET':>8} {'RESEND_AT':<25} LAST_ERROR"
            )
            for r in rows:
                resend = r.resend_at.isoformat(timespec="seconds") if r.resend_at else "-"
                print(
                    f"{r.message_id:<32} {r.status.value:<9} {r.send_count:>5} {_clip(r.topic, 16):<16} "
                    f"{_clip(r.consumer_group, 16):<16} {'' if r.queue_id is None else r.queue_id:>3} "
                    f"{'' if r.queue_offset is None else r.queue_offset:>8} {resend:<25} "
                    f"{_clip(r.last_error, 60)}"
                )
            print(f"({len(rows)} stub(s))")
    finally:
        engine.dispose()
    return 0


def _show(args: argparse.Namespace) -> int:
    engine = make_engine(require_db(args))
    try:
        from sqlalchemy.orm import Session

        with Session(engine) as s:
            row = s.get(MessageStub, args.message_id)
            if row is None:
                raise StubNotFoundError(f"no such stub: {args.message_id}")
            for col in MessageStub.__table__.columns:
                value = getattr(row, col.key)
                if col.key == "content":
                    value = f"{len(value)} bytes"
                elif hasattr(value, "isoformat"):
                    value = value.isoformat()
                print(f"{col.key:<15} {'' if value is None else value}")
            deliveries = s.execute(
                select(func.count(), func.max(MessageLog.received_at)).where(
                    MessageLog.message_id == row.message_id, MessageLog.consumer_group == row.consumer_group
                )
            ).one()
            last = deliveries[1].isoformat() if deliveries[1] else "-"
            print(f"{'deliveries':<15} {deliveries[0]} (newest {last})")
            for n in s.scalars(select(StubNotification).where(StubNotification.message_id == row.message_id)):
                state = f"sent {n.notified_at.isoformat()}" if n.notified_at else f"OWED ({n.attempts} tries)"
                print(f"{'notify ' + n.channel:<15} {state} {_clip(n.last_error, 80)}")
    finally:
        engine.dispose()
    return 0


def _revive(args: argparse.Namespace) -> int:
    engine = make_engine(require_db(args))
    try:
        count = revive(engine, args.message_ids, now=utcnow())
    finally:
        engine.dispose()
    print(f"revived {count} stub(s): PENDING, send budget reset, due at the next sweep round")
    return 0
