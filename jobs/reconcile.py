"""The reconciliation report as a Spark application.

On a cluster (the ``reliable`` package installed on the driver; executors only run built-in Spark SQL, so
they need nothing but the JDBC driver jar)::

    spark-submit --master yarn --deploy-mode client \\
        --driver-memory 4g --jars /usr/share/java/postgresql.jar \\
        jobs/reconcile.py --db postgresql://reader@db/app --out /data/reconcile/$(date +%F) \\
        --since "$(date -d yesterday +%F)T00:00:00Z" --until "$(date +%F)T00:00:00Z" \\
        --max-lost 0 --max-stuck 0

Locally ``reliable reconcile`` does the same with ``local[*]``. Exit code 0, or 2 when a threshold is crossed;
bad options and inputs (a database that is unreachable or has no reliable schema, checked before Spark
starts) are one line on stderr and exit 2 too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from reliable.cli.common import one_line
    from reliable.cli.reconcile import add_arguments, run
    from reliable.errors import ReliableError

    parser = argparse.ArgumentParser(
        prog="reconcile.py", description=__doc__.splitlines()[0] if __doc__ else None
    )
    add_arguments(parser, default_master=None)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ReliableError, OSError, ValueError) as exc:
        print(f"reconcile: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except SQLAlchemyError as exc:  # the SQLite export's reads (the schema is checked before, a table may go)
        print(f"reconcile: error: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
