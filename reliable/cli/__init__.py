"""The ``reliable`` command line.

Each subcommand lives in its own module here and exposes ``register(subparsers)``; the handler it sets with
``set_defaults(func=...)`` returns an exit code. Every expected failure becomes one line on stderr and exit
code 2 (no traceback); ``RELIABLE_DEBUG=1`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from reliable.cli.common import one_line
from reliable.errors import ReliableError

#: subcommand modules, in --help order; a module that fails to import (optional extra missing) is skipped.
COMMANDS = ("demo", "db", "sweep", "stubs", "reconcile", "export")


class Parser(argparse.ArgumentParser):
    """argparse, with two changes every subcommand's parser inherits (``add_parser`` makes its own class):

    * a usage error is ONE line and a pointer to ``--help`` (exit 2), not 12–15 lines of usage first;
    * a value that starts with a minus and a digit (``--older-than -5d``) is a value, refused by its own
      check, not "expected one argument" (argparse takes only plain negative numbers for values).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="reliable",
        description="Exactly-once effect and no message lost for consumers of at-least-once brokers.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"reliable.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("reliable.cli."):
                continue  # not written yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print("reliable: interrupted", file=sys.stderr)
        return 130
    except (ReliableError, OSError, ValueError) as exc:
        if os.environ.get("RELIABLE_DEBUG"):
            raise
        print(f"reliable: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # database drivers raise their own types; still one line
        if os.environ.get("RELIABLE_DEBUG"):
            raise
        print(f"reliable: error: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
