"""Deployable entry point of the resend sweeper: ``python -m jobs.resend --cron "*/1 * * * *" …``.

Exactly ``reliable sweep`` (same options, same code); it exists so a deployment (cron line, systemd unit,
container command) can name a job file rather than a CLI subcommand. See docs/sweeper.md.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from reliable.cli import main as cli_main


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return cli_main(["sweep", *args])


if __name__ == "__main__":
    sys.exit(main())
