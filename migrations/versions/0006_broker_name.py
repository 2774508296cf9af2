"""broker_name: the RocketMQ broker group becomes part of a queue's identity.

On a RocketMQ cluster of several broker groups, queue 0 of ``orders`` on ``broker-a`` and queue 0 of
``orders`` on ``broker-b`` are different queues with independent offsets. Until this revision a position was
``(topic, queue_id)``, so the two shared one watermark and the sweeper could misjudge a loss. Adds
``broker_name VARCHAR(64) NOT NULL DEFAULT ''`` to ``message_stub`` (where the producer's send landed),
``message_inbox`` (where a targeted resend landed), ``message_log`` (the delivered position) and
``consume_progress``, whose primary key becomes ``(consumer_group, topic, broker_name, queue_id)``.

Upgrade: every existing row gets ``''`` (the group is not known after the fact); the sweeper treats a
position with ``''`` as "broker group unknown" (see reliable/sweeper/triage.py). Downgrade: watermark rows
of one ``(group, topic, queue)`` on several broker groups are folded into one (highest ``max_offset``,
lowest ``min_offset``, summed counts, the earliest ``created_at`` and latest ``updated_at``) — what the old
key could hold — and the column is dropped everywhere.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from reliable.migrate import refuse_offline

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PK = "pk_consume_progress"
_TABLES = ("message_stub", "message_inbox", "message_log")


def _column() -> sa.Column[str]:
    return sa.Column("broker_name", sa.String(64), nullable=False, server_default="")


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(_column())
    with op.batch_alter_table("consume_progress") as batch:
        batch.add_column(_column())
        batch.drop_constraint(_PK, type_="primary")
        batch.create_primary_key(_PK, ["consumer_group", "topic", "broker_name", "queue_id"])


def downgrade() -> None:
    _fold_progress()
    with op.batch_alter_table("consume_progress") as batch:
        batch.drop_constraint(_PK, type_="primary")
        batch.create_primary_key(_PK, ["consumer_group", "topic", "queue_id"])
        batch.drop_column("broker_name")
    for table in reversed(_TABLES):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("broker_name")


def _fold_progress() -> None:
    """One row per (group, topic, queue) before the old key comes back (the table is small: groups ×
    queues, so it is folded in Python, the same way on every backend)."""
    refuse_offline("the downgrade of 0006 (folding consume_progress per queue)")
    conn = op.get_bind()
    progress = sa.table(
        "consume_progress",
        *(
            sa.column(c)
            for c in (
                "consumer_group",
                "topic",
                "queue_id",
                "broker_name",
                "max_offset",
                "min_offset",
                "created_at",
                "updated_at",
                "received_count",
            )
        ),
    )
    rows = conn.execute(sa.select(progress)).mappings().all()
    folded: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for r in rows:
        key = (r["consumer_group"], r["topic"], r["queue_id"])
        cur = folded.get(key)
        if cur is None:
            folded[key] = {**r, "broker_name": ""}
            continue
        cur["max_offset"] = max(cur["max_offset"], r["max_offset"])
        cur["min_offset"] = min(cur["min_offset"], r["min_offset"])
        cur["created_at"] = min(cur["created_at"], r["created_at"])
        cur["updated_at"] = max(cur["updated_at"], r["updated_at"])
        cur["received_count"] = cur["received_count"] + r["received_count"]
    if len(folded) == len(rows) and all(r["broker_name"] == "" for r in rows):
        return
    conn.execute(sa.delete(progress))
    if folded:
        conn.execute(sa.insert(progress), list(folded.values()))
