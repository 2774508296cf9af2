"""MySQL/MariaDB: ids compare exactly — the contract tables take a binary collation.

The tables had the database's default collation (``utf8mb4_general_ci`` on MariaDB): blind to case, accents
and trailing spaces. Two distinct message ids such as ``Ord-aB`` and ``ord-Ab`` were one key. The producer
refused the second (``DuplicateMessageIdError``); the guard, which reads rows back keyed by the id it sent,
found no row for the second and answered each of its deliveries ``confirm_conflict`` (retry) — never
processed, never dead-lettered. PostgreSQL and SQLite compare bytes, and so do these tables now: every text
column takes the server's exact binary collation — MariaDB's ``utf8mb4_nopad_bin`` (trailing spaces count),
MySQL 8's ``utf8mb4_0900_bin``, else ``utf8mb4_bin``. Rows stay as they are: a binary collation tells apart
what the old one did, so no key can collide. Downgrade: back to the database's default character set and
collation.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = (
    "message_stub",
    "message_inbox",
    "message_log",
    "consume_progress",
    "stub_notification",
    "kafka_offset",
)


def exact_collation(bind: sa.Connection) -> str:
    """The binary collation of the connected server that compares every byte, trailing spaces included."""
    version = tuple(bind.dialect.server_version_info or ())
    if getattr(bind.dialect, "is_mariadb", False):
        return "utf8mb4_nopad_bin" if version >= (10, 2) else "utf8mb4_bin"
    return "utf8mb4_0900_bin" if version >= (8, 0) else "utf8mb4_bin"


def _convert(charset: str, collation: str) -> None:
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} CONVERT TO CHARACTER SET {charset} COLLATE {collation}")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name in ("mysql", "mariadb"):
        _convert("utf8mb4", exact_collation(bind))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name in ("mysql", "mariadb"):
        charset, collation = bind.execute(
            sa.text(
                "SELECT default_character_set_name, default_collation_name FROM information_schema.schemata "
                "WHERE schema_name = DATABASE()"
            )
        ).one()
        _convert(charset, collation)
