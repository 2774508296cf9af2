"""Schema management through Alembic, used by ``reliable db upgrade`` and :meth:`Reliability.create_schema`.

There is one way to create the schema (running the migrations) so ``create_schema()`` and
``alembic upgrade head`` cannot disagree.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

import migrations as _migrations_pkg


def alembic_config(engine: Engine | None = None, url: str | None = None) -> Config:
    """An Alembic config pointing at the packaged ``migrations/`` directory."""
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(_migrations_pkg.__file__).parent))
    cfg.attributes["configure_logger"] = False
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if engine is not None:
        cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema of ``engine``'s database to ``revision``."""
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    """Take the schema back to ``revision`` (``base`` drops every table)."""
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def current(engine: Engine) -> str | None:
    """The revision the database is at, or ``None`` for an empty database."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
