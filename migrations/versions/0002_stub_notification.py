"""Give-up notices: stub_notification (one row per DEAD stub and notification channel).

The resend sweeper records here which channels (e-mail, webhook) still owe a person the news that a stub went
DEAD, so a failing channel is retried on the next round and a notice is sent once, not once per round.
Purely additive: no existing table changes.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from reliable.models import UTCDateTime

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "stub_notification",
        sa.Column("message_id", sa.String(64), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("notified_at", UTCDateTime),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text),
        sa.PrimaryKeyConstraint("message_id", "channel", name="pk_stub_notification"),
    )
    op.create_index("ix_stub_notification_notified_at", "stub_notification", ["notified_at"])


def downgrade() -> None:
    op.drop_index("ix_stub_notification_notified_at", table_name="stub_notification")
    op.drop_table("stub_notification")
