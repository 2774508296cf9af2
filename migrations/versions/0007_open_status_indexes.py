"""PostgreSQL: the status indexes of message_inbox and message_stub hold only open rows.

``ix_message_inbox_status_resend_at`` and ``ix_message_stub_status_resend_at`` serve the sweeper's walks
(``status = 'PENDING' AND resend_at <= now ORDER BY resend_at``, reliable/sweeper/selection.py and
``settle_slice`` in reliable/outbox.py). Every row the guard confirms or claims is ``CONFIRMED`` and never
read through them, yet each such write added an entry (a status change is never a HOT update while the
column is indexed). On PostgreSQL they become partial, ``WHERE status IN ('PENDING', 'DEAD')``: a confirm or
a claim writes one index entry fewer per row (two on the stub path), and the indexes stay the size of the
open rows instead of growing with history (issue 18, server work per message; docs/benchmarks/core.md). Same
names and columns; SQLite and MariaDB keep the full indexes (MariaDB has no partial indexes).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: (index, table); both on (status, resend_at)
_INDEXES = (
    ("ix_message_inbox_status_resend_at", "message_inbox"),
    ("ix_message_stub_status_resend_at", "message_stub"),
)
OPEN_ROWS = "status IN ('PENDING', 'DEAD')"


def _recreate(*, partial: bool) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    where = sa.text(OPEN_ROWS) if partial else None
    for name, table in _INDEXES:
        op.drop_index(name, table_name=table)
        op.create_index(name, table, ["status", "resend_at"], postgresql_where=where)


def upgrade() -> None:
    _recreate(partial=True)


def downgrade() -> None:
    _recreate(partial=False)
