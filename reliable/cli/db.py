"""``reliable db upgrade|downgrade|current|stamp``: the Alembic migrations without an alembic.ini at hand.

``stamp`` records a revision without running anything: the way out for tables that exist with no revision
recorded (``metadata.create_all``, a lost version table), which ``upgrade`` cannot create again."""

from __future__ import annotations

import argparse
from typing import Any

from alembic.util import CommandError
from sqlalchemy import Engine, make_url
from sqlalchemy.exc import SQLAlchemyError

from reliable import migrate
from reliable.cli.common import (
    DatabaseNotReadyError,
    add_db_options,
    cannot_open,
    check_sqlite_file,
    require_db,
    sqlite_file,
    unknown_revision,
    unrecorded_schema,
)
from reliable.errors import ConfigurationError
from reliable.facade import make_engine  # a bad URL: require_db's one line, exit 2


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("db", help="create or migrate the reliable tables")
    dbsub = p.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = dbsub.add_parser("upgrade", help="migrate to a revision (default: head)")
    up.add_argument("revision", nargs="?", default="head")
    add_db_options(up)
    up.set_defaults(func=_upgrade)
    down = dbsub.add_parser("downgrade", help="migrate back to a revision (base drops every table)")
    down.add_argument("revision")
    down.add_argument(
        "--yes", action="store_true", help="do it: a downgrade drops columns or tables, with their data"
    )
    add_db_options(down)
    down.set_defaults(func=_downgrade)
    cur = dbsub.add_parser("current", help="print the revision the database is at")
    add_db_options(cur)
    cur.set_defaults(func=_current)
    stamp = dbsub.add_parser(
        "stamp",
        help="record that the tables are at a revision, changing nothing else (tables made elsewhere)",
    )
    stamp.add_argument("revision")
    add_db_options(stamp)
    stamp.set_defaults(func=_stamp)


def _first_read(engine: Engine) -> str | None:
    """The database's revision, read by the command's first connection: a database that cannot be opened is
    one line and exit 2 (as for ``reliable sweep``), not the driver's exception and exit 1 — say a SQLite
    file in a directory that does not exist, which an upgrade would otherwise create. reliable's tables with
    no revision recorded are said, with ``db stamp`` as the way out."""
    try:
        at = migrate.current(engine)
        unrecorded = unrecorded_schema(engine) if at is None else None
    except SQLAlchemyError as exc:
        raise cannot_open(exc) from None
    if unrecorded is not None:
        raise unrecorded
    return at


def _writable(url: str) -> str:
    """``url``, unless it is a SQLite database in memory: a migration there is lost when the command ends,
    and it said "database at revision …" as if something had been saved."""
    if make_url(url).get_backend_name() == "sqlite" and sqlite_file(url) is None:
        raise ConfigurationError(
            f"{url} is a SQLite database in memory: nothing would be saved; give a file, sqlite:///path/app.db"
        )
    return url


def _upgrade(args: argparse.Namespace) -> int:
    engine = make_engine(_writable(require_db(args)))
    try:
        at = _first_read(engine)
        order = migrate.ordered_revisions()
        if at is not None and at not in order:
            raise DatabaseNotReadyError(unknown_revision(at))
        if at is not None and args.revision in order and order.index(args.revision) < order.index(at):
            # Alembic does nothing and says nothing: the database stayed where it was
            raise ConfigurationError(
                f"revision {args.revision} is below the database's {at}: use `reliable db downgrade`"
            )
        try:
            migrate.upgrade(engine, args.revision)
        except CommandError as exc:  # unknown revision and the like: bad input, not a crash
            raise ConfigurationError(str(exc)) from None
        print(f"database at revision {migrate.current(engine)}")
    finally:
        engine.dispose()
    return 0


def _downgrade(args: argparse.Namespace) -> int:
    url = require_db(args)
    if not args.yes:  # `db downgrade base` dropped every table, its rows with it, without a question
        raise ConfigurationError(
            f"a downgrade to {args.revision} drops columns or tables with their data: run again with --yes"
        )
    engine = make_engine(url)
    try:
        _first_read(engine)
        try:
            migrate.downgrade(engine, args.revision)
        except CommandError as exc:  # unknown revision and the like: bad input, not a crash
            raise ConfigurationError(str(exc)) from None
        print(f"database at revision {migrate.current(engine) or 'base'}")
    finally:
        engine.dispose()
    return 0


def _current(args: argparse.Namespace) -> int:
    url = require_db(args)
    check_sqlite_file(url)  # a mistyped path was created, and printed as an empty database
    engine = make_engine(url)
    try:
        print(_first_read(engine) or "base (empty)")
    finally:
        engine.dispose()
    return 0


def _stamp(args: argparse.Namespace) -> int:
    url = _writable(require_db(args))
    check_sqlite_file(url)  # nothing to stamp in a file that is not there
    engine = make_engine(url)
    try:
        try:
            migrate.current(engine)
        except SQLAlchemyError as exc:
            raise cannot_open(exc) from None
        try:
            migrate.stamp(engine, args.revision)
        except CommandError as exc:  # unknown revision
            raise ConfigurationError(str(exc)) from None
        print(f"database stamped at revision {migrate.current(engine) or 'base'} (no table changed)")
    finally:
        engine.dispose()
    return 0
