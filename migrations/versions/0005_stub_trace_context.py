"""message_stub.trace_context: the message's trace context, so the sweeper's resends carry it.

The producer stores the OpenTelemetry propagation carrier (JSON text, ``{"traceparent": "00-…"}``) of the
``create`` span it started when the stub was staged; a resend puts it back into the message properties, so a
consumer links its ``process`` span to the producer's trace however late the message arrives (see
reliable/otel). Nullable and purely additive: stubs staged with telemetry off, or before this revision, have
none.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("message_stub") as batch:
        batch.add_column(sa.Column("trace_context", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("message_stub") as batch:
        batch.drop_column("trace_context")
