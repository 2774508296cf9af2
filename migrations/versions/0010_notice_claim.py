"""stub_notification.claimed_until, and never-consumed alarms moved onto their own key.

Why the column: a sweeper delivering owed notices kept the rows' locks across the SMTP or HTTP call, and on
MariaDB that locking read's gap locks held up other sweepers' give-ups (their record transaction holds the
group's inbox rows, so consumers waited as long as the mail server). Delivery now claims the rows in a
short transaction (``claimed_until``: other sweepers skip them until then), delivers with no transaction
open and marks them in a second one; a sweeper killed mid-delivery leaves them owed, due again when the
claim ends. Nullable and additive.

Why the data: a never-consumed alarm used to be owed on an example waiting message's ``(message, group)``
key, and giving up (or reviving, voiding) that message deleted the owed alarm while its ``~never:`` marker
stayed — the alarm was never raised again, nobody told. The marker row now is the alarm. The alarm rows of
each marker's (group, reason) found on a message key move to the marker's key; the downgrade leaves them
there (the code of before delivers owed rows whatever their key). An offline (``--sql``) script does not
move them: they stay where they were, delivered as before.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from reliable.models import UTCDateTime

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = ("message_id", "consumer_group", "channel", "reason", "created_at", "notified_at", "attempts")


def upgrade() -> None:
    with op.batch_alter_table("stub_notification") as batch:
        batch.add_column(sa.Column("claimed_until", UTCDateTime))
    _alarms_onto_their_markers()


def downgrade() -> None:
    with op.batch_alter_table("stub_notification") as batch:
        batch.drop_column("claimed_until")


def _alarms_onto_their_markers() -> None:
    if context.is_offline_mode():  # rows to read: an online upgrade's only
        return
    bind = op.get_bind()
    t = sa.table("stub_notification", *(sa.column(c) for c in (*_COLUMNS, "last_error")))
    on_message_key = ~t.c.message_id.like("~%")
    markers = bind.execute(
        sa.select(t.c.message_id, t.c.consumer_group, t.c.reason).where(
            t.c.channel == "log", t.c.message_id.like("~never:%")
        )
    ).all()
    for marker, group, reason in markers:
        same = sa.and_(t.c.consumer_group == group, t.c.reason == reason, on_message_key)
        have = set(
            bind.execute(
                sa.select(t.c.channel).where(t.c.message_id == marker, t.c.consumer_group == group)
            ).scalars()
        )
        for row in bind.execute(sa.select(t).where(same, t.c.channel != "log")).mappings().all():
            if row["channel"] not in have:
                have.add(row["channel"])
                bind.execute(sa.insert(t).values({**row, "message_id": marker}))
        bind.execute(sa.delete(t).where(same))
