"""message_inbox.resend_topic: the topic a group's newest targeted resend went to.

Why: a targeted resend lands where the sender puts it — ``%RETRY%{group}`` for broker_sim and RocketMQ 4.x,
the message's own topic for RabbitMQ (the group's queue), Kafka and RocketMQ 5.x — and the inbox row kept its
broker group, queue and offset but not its topic. So the reconciliation report assumed ``%RETRY%{group}`` and
could not call a resend on the message's own topic lost, and the sweeper had to ask its *current* sender
where resends land (a sweeper restarted with another sender misread the rows of the old one).

Nullable and additive: ``NULL`` means the group's newest copy is the producer's (no targeted resend landed)
or the resend was recorded before this revision (readers keep their old assumption for it). Existing rows
are not back-filled: which sender wrote them is not known after the fact. The downgrade drops the column.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("message_inbox") as batch:
        # 127: RocketMQ's topic limit (reliable.constants.TOPIC_MAX when written; frozen here)
        batch.add_column(sa.Column("resend_topic", sa.String(127)))


def downgrade() -> None:
    with op.batch_alter_table("message_inbox") as batch:
        batch.drop_column("resend_topic")
