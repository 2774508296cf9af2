"""Initial schema: message_stub, message_log, consume_progress.

The types are imported from :mod:`reliable.models` (``UTCDateTime``, the body and id variants) so a migration
and ``create_schema()`` cannot drift apart; ``tests/test_migrations.py`` compares the two on every backend.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from reliable.models import BigId, Body, UTCDateTime

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STUB_STATUSES = ("PENDING", "CONFIRMED", "VOIDED", "DEAD")
LOG_OUTCOMES = ("SUCCESS", "DUPLICATE", "RETRY", "DEAD_LETTER")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    # op.f() marks a CHECK name as final: without it Alembic applies the models' naming convention to it a
    # second time ("ck_message_stub_ck_message_stub_stub_status") and the migrated schema would differ from
    # the models (tests/test_migrations.py compares the two).
    op.create_table(
        "message_stub",
        sa.Column("message_id", sa.String(64), nullable=False),
        sa.Column("topic", sa.String(127), nullable=False),
        sa.Column("tags", sa.String(255)),
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("content", Body, nullable=False),
        sa.Column("payload_hash", sa.String(64)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("send_count", sa.Integer, nullable=False),
        sa.Column("queue_id", sa.Integer),
        sa.Column("queue_offset", sa.BigInteger),
        sa.Column("resend_at", UTCDateTime),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.Column("last_sent_at", UTCDateTime),
        sa.Column("confirmed_at", UTCDateTime),
        sa.Column("last_error", sa.Text),
        sa.PrimaryKeyConstraint("message_id", name="pk_message_stub"),
        sa.CheckConstraint(_in("status", STUB_STATUSES), name=op.f("ck_message_stub_stub_status")),
    )
    op.create_index("ix_message_stub_status_resend_at", "message_stub", ["status", "resend_at"])
    op.create_index("ix_message_stub_created_at", "message_stub", ["created_at"])
    op.create_index(
        "ix_message_stub_topic_queue_id_queue_offset", "message_stub", ["topic", "queue_id", "queue_offset"]
    )

    op.create_table(
        "message_log",
        sa.Column("id", BigId, nullable=False, autoincrement=True),
        sa.Column("message_id", sa.String(64), nullable=False),
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("topic", sa.String(127), nullable=False),
        sa.Column("queue_id", sa.Integer, nullable=False),
        sa.Column("queue_offset", sa.BigInteger, nullable=False),
        sa.Column("reconsume_times", sa.Integer, nullable=False),
        sa.Column("received_at", UTCDateTime, nullable=False),
        sa.Column("outcome", sa.String(16)),
        sa.Column("worker", sa.String(128)),
        sa.Column("reason", sa.Text),
        sa.PrimaryKeyConstraint("id", name="pk_message_log"),
        sa.CheckConstraint(_in("outcome", LOG_OUTCOMES), name=op.f("ck_message_log_log_outcome")),
    )
    op.create_index(
        "ix_message_log_message_id_consumer_group_received_at",
        "message_log",
        ["message_id", "consumer_group", "received_at"],
    )
    op.create_index("ix_message_log_received_at", "message_log", ["received_at"])

    op.create_table(
        "consume_progress",
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("topic", sa.String(127), nullable=False),
        sa.Column("queue_id", sa.Integer, nullable=False),
        sa.Column("max_offset", sa.BigInteger, nullable=False),
        sa.Column("min_offset", sa.BigInteger, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.Column("received_count", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("consumer_group", "topic", "queue_id", name="pk_consume_progress"),
    )


def downgrade() -> None:
    op.drop_table("consume_progress")
    op.drop_index("ix_message_log_received_at", table_name="message_log")
    op.drop_index("ix_message_log_message_id_consumer_group_received_at", table_name="message_log")
    op.drop_table("message_log")
    op.drop_index("ix_message_stub_topic_queue_id_queue_offset", table_name="message_stub")
    op.drop_index("ix_message_stub_created_at", table_name="message_stub")
    op.drop_index("ix_message_stub_status_resend_at", table_name="message_stub")
    op.drop_table("message_stub")
