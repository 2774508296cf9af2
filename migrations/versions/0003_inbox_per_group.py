"""Inbox per consumer group: message_inbox, message_log.original_topic, stub_notification per group.

Until 0002 the stub *was* the inbox: one ``message_stub`` row per message, keyed by ``message_id`` alone, with
one ``consumer_group`` column, so a second group consuming the same topic was refused. From 0003 on the stub
is the producer's record of the message (one per message) and ``message_inbox`` holds each group's state
(one per ``(consumer_group, message_id)``).

Data moved forward:

* every stub → one inbox row for its group: its status, ``attempts`` (the group's journaled handler failures),
  ``resend_count`` (its resends: ``send_count - 1``), ``resend_at``, ``last_error``; the stub keeps its
  topic-wide send history. Stubs the 0001/0002 guard wrote itself for messages nobody staged (the inbox
  pattern: ``CONFIRMED``, never sent, confirmed in the transaction that created them) become inbox rows only.
* ``message_log.original_topic`` ← ``topic`` (older adapters journaled the original topic).
* each notice → the group of its stub.

And back (the old schema holds one group per message, so a fan-out cannot survive a downgrade in full): each
stub takes the group of an unconfirmed inbox row if there is one, else the first group alphabetically; an
inbox row without a stub becomes a ``CONFIRMED`` stub with an empty body (the old guard's inbox row) — only
for the first group of that message; notices keep the first group per (message, channel).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from reliable.models import Body, UTCDateTime

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = ("PENDING", "CONFIRMED", "VOIDED", "DEAD")
#: how the 0001/0002 guard marked a handler failure in ``message_log.reason``
HANDLER_FAILED = "handler_failed%"

stub = sa.table(
    "message_stub",
    sa.column("message_id"),
    sa.column("topic"),
    sa.column("consumer_group"),
    sa.column("content", Body),
    sa.column("payload_hash"),
    sa.column("status"),
    sa.column("send_count"),
    sa.column("queue_offset"),
    sa.column("resend_at"),
    sa.column("created_at"),
    sa.column("updated_at"),
    sa.column("last_sent_at"),
    sa.column("confirmed_at"),
    sa.column("last_error"),
)
inbox = sa.table(
    "message_inbox",
    sa.column("consumer_group"),
    sa.column("message_id"),
    sa.column("status"),
    sa.column("attempts"),
    sa.column("payload_hash"),
    sa.column("first_received_at"),
    sa.column("confirmed_at"),
    sa.column("resend_count"),
    sa.column("resend_at"),
    sa.column("last_error"),
    sa.column("created_at"),
    sa.column("updated_at"),
)
log = sa.table(
    "message_log",
    sa.column("message_id"),
    sa.column("consumer_group"),
    sa.column("topic"),
    sa.column("original_topic"),
    sa.column("received_at"),
    sa.column("outcome"),
    sa.column("reason"),
)
NOTICE_COLUMNS = (
    "message_id",
    "consumer_group",
    "channel",
    "reason",
    "created_at",
    "notified_at",
    "attempts",
)


def _notice_table(name: str, *, pk: bool, group: bool = True) -> None:
    """``stub_notification`` as 0003 has it (``group``) or as 0002 had it; ``pk=False``: a key-less copy."""
    key = ("message_id", "consumer_group", "channel") if group else ("message_id", "channel")
    op.create_table(
        name,
        sa.Column("message_id", sa.String(64), nullable=False),
        *([sa.Column("consumer_group", sa.String(255), nullable=False)] if group else []),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("notified_at", UTCDateTime),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text),
        *([sa.PrimaryKeyConstraint(*key, name="pk_stub_notification")] if pk else []),
    )


def _notices(name: str) -> sa.TableClause:
    return sa.table(name, *(sa.column(c) for c in (*NOTICE_COLUMNS, "last_error")))


def _guard_made() -> sa.ColumnElement[bool]:
    """A stub the old guard inserted itself (inbox pattern): confirmed when created, never sent."""
    return sa.and_(
        stub.c.status == "CONFIRMED",
        stub.c.send_count == 0,
        stub.c.last_sent_at.is_(None),
        stub.c.queue_offset.is_(None),
        stub.c.confirmed_at == stub.c.created_at,
    )


def upgrade() -> None:
    op.create_table(
        "message_inbox",
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("message_id", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("payload_hash", sa.String(64)),
        sa.Column("first_received_at", UTCDateTime),
        sa.Column("confirmed_at", UTCDateTime),
        sa.Column("resend_count", sa.Integer, nullable=False),
        sa.Column("resend_at", UTCDateTime),
        sa.Column("queue_id", sa.Integer),
        sa.Column("queue_offset", sa.BigInteger),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("consumer_group", "message_id", name="pk_message_inbox"),
        sa.CheckConstraint(
            f"status IN ({', '.join(repr(s) for s in STATUSES)})", name=op.f("ck_message_inbox_inbox_status")
        ),
    )
    op.create_index("ix_message_inbox_status_resend_at", "message_inbox", ["status", "resend_at"])
    op.create_index("ix_message_inbox_message_id_status", "message_inbox", ["message_id", "status"])
    op.add_column("message_log", sa.Column("original_topic", sa.String(127)))
    op.execute(log.update().values(original_topic=log.c.topic))

    mine = sa.and_(log.c.message_id == stub.c.message_id, log.c.consumer_group == stub.c.consumer_group)
    failures = (
        sa.select(sa.func.count())
        .where(mine, log.c.outcome == "RETRY", log.c.reason.like(HANDLER_FAILED))
        .scalar_subquery()
    )
    first_seen = sa.select(sa.func.min(log.c.received_at)).where(mine).scalar_subquery()
    resends = sa.case((stub.c.send_count > 1, stub.c.send_count - 1), else_=0)
    op.execute(
        inbox.insert().from_select(
            [c.name for c in inbox.c],
            sa.select(
                stub.c.consumer_group,
                stub.c.message_id,
                stub.c.status,
                failures,
                stub.c.payload_hash,
                first_seen,
                stub.c.confirmed_at,
                resends,
                stub.c.resend_at,
                stub.c.last_error,
                stub.c.created_at,
                stub.c.updated_at,
            ),
        )
    )

    # notices: rebuild with the group in the key (via a key-less copy, so names match on every backend)
    _notice_table("stub_notification_0003", pk=False)
    old, tmp = _notices("stub_notification"), _notices("stub_notification_0003")
    group = sa.select(stub.c.consumer_group).where(stub.c.message_id == old.c.message_id).scalar_subquery()
    cols = [old.c[c] for c in NOTICE_COLUMNS if c != "consumer_group"]
    op.execute(
        tmp.insert().from_select(
            [*NOTICE_COLUMNS, "last_error"],
            sa.select(cols[0], sa.func.coalesce(group, ""), *cols[1:], old.c.last_error),
        )
    )
    op.drop_index("ix_stub_notification_notified_at", table_name="stub_notification")
    op.drop_table("stub_notification")
    _notice_table("stub_notification", pk=True)
    op.create_index("ix_stub_notification_notified_at", "stub_notification", ["notified_at"])
    op.execute(
        _notices("stub_notification").insert().from_select([*NOTICE_COLUMNS, "last_error"], sa.select(tmp))
    )
    op.drop_table("stub_notification_0003")

    op.execute(stub.delete().where(_guard_made()))
    op.drop_column("message_stub", "consumer_group")


def downgrade() -> None:
    op.add_column("message_stub", sa.Column("consumer_group", sa.String(255)))
    # an inbox row without a stub was the old guard's own stub (first group of the message only)
    i2 = inbox.alias("i2")
    is_first = ~sa.exists().where(
        i2.c.message_id == inbox.c.message_id, i2.c.consumer_group < inbox.c.consumer_group
    )
    topic = (
        sa.select(sa.func.coalesce(sa.func.min(log.c.original_topic), sa.func.min(log.c.topic)))
        .where(log.c.message_id == inbox.c.message_id, log.c.consumer_group == inbox.c.consumer_group)
        .scalar_subquery()
    )
    when = sa.func.coalesce(inbox.c.confirmed_at, inbox.c.created_at)
    op.execute(
        stub.insert().from_select(
            [
                "message_id",
                "topic",
                "consumer_group",
                "content",
                "payload_hash",
                "status",
                "send_count",
                "created_at",
                "updated_at",
                "confirmed_at",
            ],
            sa.select(
                inbox.c.message_id,
                sa.func.coalesce(topic, ""),
                inbox.c.consumer_group,
                sa.literal(b"", Body),
                inbox.c.payload_hash,
                sa.literal("CONFIRMED"),
                sa.literal(0),
                when,
                when,
                when,
            ).where(is_first, ~sa.exists().where(stub.c.message_id == inbox.c.message_id)),
        )
    )
    # every other stub: the group that still owes work, else the first one
    of_stub = inbox.c.message_id == stub.c.message_id
    owing = sa.select(sa.func.min(inbox.c.consumer_group)).where(of_stub, inbox.c.status != "CONFIRMED")
    any_group = sa.select(sa.func.min(inbox.c.consumer_group)).where(of_stub)
    op.execute(
        stub.update()
        .where(stub.c.consumer_group.is_(None))
        .values(consumer_group=sa.func.coalesce(owing.scalar_subquery(), any_group.scalar_subquery(), ""))
    )
    # the chosen group's targeted resends count towards the old, single send budget
    chosen = sa.and_(of_stub, inbox.c.consumer_group == stub.c.consumer_group)
    resends = sa.select(inbox.c.resend_count).where(chosen).scalar_subquery()
    op.execute(
        stub.update().where(resends + 1 > stub.c.send_count, resends > 0).values(send_count=resends + 1)
    )
    with op.batch_alter_table("message_stub") as batch:
        batch.alter_column("consumer_group", existing_type=sa.String(255), nullable=False)

    _notice_table("stub_notification_0002", pk=False, group=False)
    cur = _notices("stub_notification")
    n2 = cur.alias("n2")
    first_notice = ~sa.exists().where(
        n2.c.message_id == cur.c.message_id,
        n2.c.channel == cur.c.channel,
        n2.c.consumer_group < cur.c.consumer_group,
    )
    kept = [c for c in (*NOTICE_COLUMNS, "last_error") if c != "consumer_group"]
    tmp = sa.table("stub_notification_0002", *(sa.column(c) for c in kept))
    op.execute(tmp.insert().from_select(kept, sa.select(*(cur.c[c] for c in kept)).where(first_notice)))
    op.drop_index("ix_stub_notification_notified_at", table_name="stub_notification")
    op.drop_table("stub_notification")
    _notice_table("stub_notification", pk=True, group=False)
    op.create_index("ix_stub_notification_notified_at", "stub_notification", ["notified_at"])
    op.execute(
        sa.table("stub_notification", *(sa.column(c) for c in kept))
        .insert()
        .from_select(kept, sa.select(tmp))
    )
    op.drop_table("stub_notification_0002")

    op.drop_column("message_log", "original_topic")
    op.drop_index("ix_message_inbox_message_id_status", table_name="message_inbox")
    op.drop_index("ix_message_inbox_status_resend_at", table_name="message_inbox")
    op.drop_table("message_inbox")
