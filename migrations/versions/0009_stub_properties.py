"""message_stub.properties: the producer's message properties, so the sweeper's resends carry them.

A resend used to carry only the trace context and the resend mark: a message whose first send failed reached
its consumers without the properties its producer gave it, and a delayed message (RocketMQ's ``DELAY``
level) was re-sent without its delay, delivered early. The producer now stores them as JSON text
(``{"biz": "x", "DELAY": "6"}``); nullable and purely additive: stubs staged before this revision, or
without properties, have none.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("message_stub") as batch:
        batch.add_column(sa.Column("properties", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("message_stub") as batch:
        batch.drop_column("properties")
