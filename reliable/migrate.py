"""Schema management through Alembic, used by ``reliable db upgrade`` and :meth:`Reliability.create_schema`.

There is one way to create the schema (running the migrations) so ``create_schema()`` and
``alembic upgrade head`` cannot disagree.

Two things a deployment needs that Alembic's defaults do not give:

* **reliable's own version table** (``reliable_alembic_version``): the handler's writes go to the
  application's database, which usually has its own Alembic migrations in ``alembic_version``. Sharing that
  table, whichever tool ran second failed with "Can't locate revision", for good. A database migrated before
  keeps its revision: :func:`adopt_legacy_version` moves reliable's row out of ``alembic_version`` (and drops
  that table if nothing else is left in it) the first time the migrations run. A row there counts as
  reliable's only when reliable's tables exist: an application numbering its own revisions 0001, 0002… lost
  its row and its version table to reliable's install.
* **one migrating process at a time** (:func:`migration_lock`): every consumer calls ``create_schema()`` at
  start, and N replicas starting together ran the same DDL at once — all but one crashed. The lock is a
  PostgreSQL transaction-level advisory lock, a MariaDB named lock, SQLite's write lock; the revision is read
  after it is taken, so the others find the schema at head and do nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import CommandError
from sqlalchemy import Column, Connection, Engine, MetaData, String, Table, func, inspect, select, text

import migrations as _migrations_pkg
from reliable import constants as C
from reliable.errors import MigrationRefusedError


class MigrationStepRefused(MigrationRefusedError, CommandError):
    """What a migration step raises to refuse: a :class:`MigrationRefusedError` for the API and ``reliable
    db`` (one line, exit 2), and an Alembic ``CommandError`` so ``alembic … --sql`` prints ``FAILED: <line>``
    instead of a traceback."""


def refuse_offline(step: str) -> None:
    """Refuse a step that reads rows when Alembic writes SQL instead of running it (``--sql``): it crashed
    on the missing result (``'NoneType' object has no attribute …``)."""
    from alembic import context

    if context.is_offline_mode():
        raise MigrationStepRefused(
            f"{step} reads the database's rows and cannot be written as SQL (--sql): run this downgrade "
            "against the database (`reliable db downgrade REV --db URL`)"
        )


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


def ordered_revisions() -> list[str]:
    """Every revision id of reliable's migrations, base to head."""
    scripts = ScriptDirectory.from_config(alembic_config())
    return [s.revision for s in reversed(list(scripts.walk_revisions()))]


def revisions() -> set[str]:
    """Every revision id of reliable's migrations."""
    return set(ordered_revisions())


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema of ``engine``'s database to ``revision``."""
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def stamp(engine: Engine, revision: str) -> None:
    """Record ``revision`` in reliable's version table without running a migration (tables that exist with
    no revision recorded)."""
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.stamp(cfg, revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    """Take the schema back to ``revision`` (``base`` drops every table).

    On MySQL/MariaDB, where each DDL statement commits, a downgrade through 0008 is checked before its first
    step: rows that would not survive 0008's conversion back refuse it (:class:`MigrationRefusedError`)
    while nothing has changed yet."""
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        if conn.dialect.name in ("mysql", "mariadb"):
            _refuse_partial_downgrade(cfg, conn, revision)
        command.downgrade(cfg, revision)


def _refuse_partial_downgrade(cfg: Config, conn: Connection, revision: str) -> None:
    from alembic.runtime.migration import MigrationContext

    at = MigrationContext.configure(
        conn, opts={"version_table": C.ALEMBIC_VERSION_TABLE}
    ).get_current_revision()
    if at is None:
        return
    scripts = ScriptDirectory.from_config(cfg)
    try:
        steps = list(scripts.iterate_revisions(at, revision))
    except RevisionError:  # unknown, or not below: alembic's own command, run next, says so in its words
        return
    if "0008" in {s.revision for s in steps}:  # the revisions undone (the target itself is not among them)
        scripts.get_revision("0008").module.refuse_unconvertible(conn)


def current(engine: Engine) -> str | None:
    """The revision the database is at, or ``None`` for an empty database (read only: a revision still in
    the shared ``alembic_version`` table counts)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        opts = {"version_table": C.ALEMBIC_VERSION_TABLE}
        at = MigrationContext.configure(conn, opts=opts).get_current_revision()
        return at if at is not None else _legacy_revision(conn)


def tables_of(revision: str) -> set[str]:
    """Tables reliable's schema has at ``revision`` that tell it apart from an application's: what makes a
    row in the shared ``alembic_version`` reliable's rather than the application's own."""
    order = ordered_revisions()
    need = {"message_stub", "message_log"}
    if order.index(revision) >= order.index("0003"):
        need.add("message_inbox")
    return need


def _legacy_revision(conn: Connection) -> str | None:
    """reliable's revision in the shared ``alembic_version``, if one is there: a row whose id is one of
    reliable's AND whose tables exist. An application numbering its own revisions 0001, 0002… has rows with
    reliable's ids; taken for reliable's, its row was deleted (and its table dropped) and reliable's schema
    never created."""
    insp = inspect(conn)
    if not insp.has_table(C.LEGACY_ALEMBIC_VERSION_TABLE):
        return None
    rows = conn.execute(text(f"SELECT version_num FROM {C.LEGACY_ALEMBIC_VERSION_TABLE}")).scalars().all()
    mine = sorted(set(rows) & revisions())
    if not mine:
        return None
    present = set(insp.get_table_names())
    return mine[-1] if tables_of(mine[-1]) <= present else None


def adopt_legacy_version(conn: Connection) -> None:
    """Move reliable's revision from the shared ``alembic_version`` into its own table (see the module doc);
    nothing when its own table exists or the shared one holds none of reliable's revisions."""
    if inspect(conn).has_table(C.ALEMBIC_VERSION_TABLE):
        return
    legacy = _legacy_revision(conn)
    if legacy is None:
        return
    own = Table(C.ALEMBIC_VERSION_TABLE, MetaData(), Column("version_num", String(32), primary_key=True))
    own.create(conn)
    conn.execute(own.insert().values(version_num=legacy))
    conn.execute(text(f"DELETE FROM {C.LEGACY_ALEMBIC_VERSION_TABLE} WHERE version_num = :v"), {"v": legacy})
    left = conn.execute(text(f"SELECT count(*) FROM {C.LEGACY_ALEMBIC_VERSION_TABLE}")).scalar()
    if not left:
        conn.execute(text(f"DROP TABLE {C.LEGACY_ALEMBIC_VERSION_TABLE}"))


@contextlib.contextmanager
def migration_lock(conn: Connection) -> Iterator[None]:
    """Hold the database's migration lock while the block runs (see the module doc)."""
    dialect = conn.dialect.name
    if dialect == "postgresql":  # released when the migration's transaction ends
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": C.MIGRATION_LOCK_KEY})
        yield
    elif dialect in ("mysql", "mariadb"):
        # DDL commits on its own there: a session-level named lock, named after the database (a named lock
        # is server-wide: a long migration of one database held every other database's up)
        name = text(f"CONCAT('{C.MIGRATION_LOCK_NAME}:', SHA1(DATABASE()))")
        got = conn.execute(select(func.get_lock(name, C.MIGRATION_LOCK_TIMEOUT_S))).scalar()
        if got != 1:
            raise TimeoutError(f"another process held the migration lock for {C.MIGRATION_LOCK_TIMEOUT_S} s")
        try:
            yield
        finally:
            conn.execute(select(func.release_lock(name)))
    else:  # SQLite: its write lock, taken by the first statement that writes
        yield
