"""Kafka offsets in the application database: kafka_offset (one row per consumer group, topic, partition).

Used only when a Kafka consumer runs with database offsets on: the guard's transaction writes the partition's
next offset together with the handler's work, and the consumer seeks there on assignment, so a lost Kafka
offset commit replays nothing already processed. Purely additive: no existing table changes.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from reliable.models import UTCDateTime

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "kafka_offset",
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("topic", sa.String(127), nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("next_offset", sa.BigInteger, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("consumer_group", "topic", "partition", name="pk_kafka_offset"),
    )


def downgrade() -> None:
    op.drop_table("kafka_offset")
