"""Alembic environment: the URL comes from ``-x db_url=``, then ``RELIABLE_DB_URL``, then the ini file."""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, engine_from_config, pool

from reliable import constants as C
from reliable.migrate import adopt_legacy_version, migration_lock
from reliable.models import metadata

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

url = context.get_x_argument(as_dictionary=True).get("db_url") or os.environ.get("RELIABLE_DB_URL")
if url:
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
if not config.get_main_option("sqlalchemy.url") and config.attributes.get("connection") is None:
    raise SystemExit("no database URL: pass -x db_url=... or set RELIABLE_DB_URL")

target_metadata = metadata


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        version_table=C.ALEMBIC_VERSION_TABLE,
    )
    with context.begin_transaction():
        context.run_migrations()


def _run(conn: Connection) -> None:
    """One process at a time; reliable's revision in its own version table (reliable/migrate.py)."""
    with migration_lock(conn):
        adopt_legacy_version(conn)
        context.configure(
            connection=conn,
            target_metadata=target_metadata,
            render_as_batch=True,
            version_table=C.ALEMBIC_VERSION_TABLE,
        )
        with context.begin_transaction():
            context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:  # called programmatically with an open connection (tests, the CLI)
        _run(connection)
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.begin() as conn:  # one transaction: the lock (PostgreSQL), the adoption and the migrations
        _run(conn)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
