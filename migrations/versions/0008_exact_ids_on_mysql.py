"""MySQL/MariaDB: ids compare exactly — the contract tables take a binary collation.

The tables had the database's default collation (``utf8mb4_general_ci`` on MariaDB): blind to case, accents
and trailing spaces. Two distinct message ids such as ``Ord-aB`` and ``ord-Ab`` were one key. The producer
refused the second (``DuplicateMessageIdError``); the guard, which reads rows back keyed by the id it sent,
found no row for the second and answered each of its deliveries ``confirm_conflict`` (retry) — never
processed, never dead-lettered. PostgreSQL and SQLite compare bytes, and so do these tables now: every text
column takes the server's exact binary collation — MariaDB's ``utf8mb4_nopad_bin`` (trailing spaces count),
MySQL 8's ``utf8mb4_0900_bin``, else ``utf8mb4_bin``. Rows stay as they are: a binary collation tells apart
what the old one did, so no key can collide. Downgrade: back to the database's default character set and
collation — refused before any table is touched when rows would not survive it (keys differing only in case,
accents or trailing spaces; text the default character set cannot hold), since MariaDB/MySQL DDL commits table
by table and a failure half-way left mixed collations.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from reliable.migrate import MigrationStepRefused, refuse_offline

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
    """The binary collation of the connected server that compares every byte, trailing spaces included.

    Offline (``--sql``) there is no server to ask: a ``mariadb://`` URL means MariaDB ≥ 10.2 (every
    supported one); a ``mysql://`` URL could be either, and the SQL wrote ``utf8mb4_bin`` (blind to trailing
    spaces) — refused with the way out."""
    if context.is_offline_mode():
        if bind.dialect.name == "mariadb" or getattr(bind.dialect, "is_mariadb", False):
            return "utf8mb4_nopad_bin"
        raise MigrationStepRefused(
            "0008 needs to know the server for --sql: write mariadb+pymysql://… for MariaDB; for MySQL run "
            "the upgrade against the database (`reliable db upgrade --db URL`)"
        )
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
        refuse_offline("the downgrade of 0008 (checking rows against the default collation)")
        charset, collation = refuse_unconvertible(bind)
        _convert(charset, collation)


def refuse_unconvertible(bind: sa.Connection) -> tuple[str, str]:
    """The database's default character set and collation, which the downgrade converts back to — or
    :class:`MigrationRefusedError` if a row would not survive that. DDL commits table by table there: a
    conversion failing on the third table left the first two converted and the revision at 0008, which
    `db upgrade` never repaired. ``reliable.migrate.downgrade`` calls this before the first step of a
    downgrade through 0008 (0009's step would already have been committed)."""
    charset, collation = bind.execute(
        sa.text(
            "SELECT default_character_set_name, default_collation_name FROM information_schema.schemata "
            "WHERE schema_name = DATABASE()"
        )
    ).one()
    for table in TABLES:
        _refuse_table(bind, table, charset, collation)
    return str(charset), str(collation)


def _refuse_table(bind: sa.Connection, table: str, charset: str, collation: str) -> None:
    """Refuse (one line naming the rows) what ``CONVERT TO`` ``charset``/``collation`` would fail on: keys
    that differ only in what the target collation ignores (case, accents, trailing spaces), and text the
    target character set cannot hold (an emoji in a latin1 database)."""
    insp = sa.inspect(bind)
    q = bind.dialect.identifier_preparer.quote  # kafka_offset.partition is a reserved word
    texts = [q(c["name"]) for c in insp.get_columns(table) if isinstance(c["type"], sa.String)]
    keys = [tuple(map(q, insp.get_pk_constraint(table)["constrained_columns"]))]
    keys += [tuple(q(str(c)) for c in i["column_names"]) for i in insp.get_indexes(table) if i["unique"]]

    def under_target(col: str) -> str:
        return f"CONVERT({col} USING {charset}) COLLATE {collation}" if col in texts else col

    for key in keys:
        if not key:
            continue
        grouped = ", ".join(under_target(c) for c in key)
        rows = bind.execute(
            sa.text(
                f"SELECT GROUP_CONCAT(CONCAT('(', CONCAT_WS(', ', {', '.join(key)}), ')') SEPARATOR ' and ')"
                f" FROM {table} GROUP BY {grouped} HAVING COUNT(*) > 1 LIMIT 3"
            )
        ).scalars()
        named = "; ".join(rows)
        if named:
            raise MigrationStepRefused(
                f"cannot take {table} back to {collation}: rows ({', '.join(key)}) = {named} would be one "
                f"key under it; delete or rename them first (nothing was changed)"
            )
    for col in texts:
        bad = bind.execute(
            sa.text(
                f"SELECT CONCAT('(', CONCAT_WS(', ', {', '.join(keys[0])}), ')') FROM {table}"
                f" WHERE CAST({col} AS BINARY) <>"
                f" CAST(CONVERT(CONVERT({col} USING {charset}) USING utf8mb4) AS BINARY) LIMIT 3"
            )
        ).scalars()
        named = " and ".join(bad)
        if named:
            raise MigrationStepRefused(
                f"cannot take {table} back to {charset}: {col} of the rows ({', '.join(keys[0])}) = {named} "
                f"holds text {charset} cannot; edit them, or give the database a utf8mb4 default "
                f"(ALTER DATABASE … CHARACTER SET utf8mb4) first (nothing was changed)"
            )
