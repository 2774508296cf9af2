"""``reliable export --to DIR --db URL``: the report's four tables as Parquet (how SQLite feeds Spark)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from reliable.cli.common import add_db_options, ready_engine, require_db


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "export",
        help="write message_stub, message_inbox, message_log and consume_progress as Parquet files",
        description="Stream the four tables into DIR/<table>.parquet (chunked: memory stays flat).",
    )
    p.add_argument("--to", required=True, metavar="DIR", type=Path, help="output directory")
    add_db_options(p)
    p.add_argument("--chunk-rows", type=int, default=50_000, metavar="N", help="rows per Parquet row group")
    p.add_argument(
        "--with-content", action="store_true", help="also export message bodies (the report never needs them)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    try:
        from reliable.reconcile.export import export_tables
    except ModuleNotFoundError as exc:  # pyarrow is in the [spark] extra
        from reliable.reconcile.errors import SparkUnavailableError

        raise SparkUnavailableError(
            f"export needs pyarrow: pip install 'reliable[spark]' ({exc.name})"
        ) from exc

    def on_chunk(table: str, rows: int) -> None:
        if not args.quiet:
            print(f"export: {table} {rows:,} rows", file=sys.stderr, flush=True)

    engine = ready_engine(require_db(args))  # missing or un-migrated: one line with the hint
    try:
        result = export_tables(
            engine, args.to, with_content=args.with_content, chunk_rows=args.chunk_rows, on_chunk=on_chunk
        )
    finally:
        engine.dispose()
    print(", ".join(f"{t} {n:,}" for t, n in result.rows.items()) + f" → {result.path}")
    return 0
