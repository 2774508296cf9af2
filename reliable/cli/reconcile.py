"""``reliable reconcile``: the reconciliation report on this machine (Spark ``local[*]``).

``jobs/reconcile.py`` uses the same options under ``spark-submit`` (where the cluster manager picks the
master). Exit code 0 when no threshold is crossed, 2 when one is (cron alerts on it); bad options and
unreadable inputs are one line on stderr (exit 2 too, as every ``reliable`` command — the line says which).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from reliable import constants as C
from reliable.durations import parse_seconds
from reliable.reconcile.config import (
    DEFAULT_ATTENTION_LIMIT,
    DEFAULT_GRACE_S,
    ReconcileConfig,
    Thresholds,
    parquet_inputs,
)
from reliable.reconcile.errors import InputError, OptionError
from reliable.settings import Settings

EXIT_OK = 0
EXIT_THRESHOLD = 2
THRESHOLD_OPTIONS = (
    "lost", "stuck", "dead", "unsent", "duplicates", "orphans", "gaps", "lag", "never_consumed",
)  # fmt: skip


def duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` → seconds."""
    try:
        return parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def timestamp(text: str) -> dt.datetime:
    """ISO 8601; without an offset the time is taken as UTC (the tables store UTC)."""
    try:
        value = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time: {text!r} (e.g. 2026-11-20T00:00:00Z)"
        ) from None
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value


def add_arguments(p: argparse.ArgumentParser, default_master: str | None) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--db",
        metavar="URL",
        help=f"SQLAlchemy URL of the database (PostgreSQL/MariaDB over JDBC; SQLite via a Parquet export) "
        f"(env {C.ENV_DB_URL})",
    )
    src.add_argument("--parquet", metavar="DIR", type=Path, help="directory written by `reliable export`")
    p.add_argument("--out", required=True, metavar="DIR", type=Path, help="where the report files go")
    p.add_argument("--since", type=timestamp, help="messages created at or after this time (ISO 8601, UTC)")
    p.add_argument("--until", type=timestamp, help="messages created before this time (ISO 8601, UTC)")
    p.add_argument("--as-of", type=timestamp, help="measure ages from this time instead of now")
    p.add_argument(
        "--grace",
        type=duration,
        default=DEFAULT_GRACE_S,
        metavar="DURATION",
        help="a group's pending inbox row below its watermark is lost after this long (default 5m)",
    )
    p.add_argument(
        "--stuck-after",
        type=duration,
        default=C.DEFAULT_STUCK_AFTER_S,
        metavar="DURATION",
        help="a delivered, unconfirmed inbox row is stuck after this long (default 15m)",
    )
    p.add_argument(
        "--log-retention",
        type=duration,
        metavar="DURATION",
        help="the sweeper's log retention: offset gaps only among deliveries received within it (older "
        "rows are what the purge kept); 0 = the whole log (default: env RELIABLE_LOG_RETENTION_S or 7d)",
    )
    p.add_argument(
        "--attention-limit",
        type=count,
        default=DEFAULT_ATTENTION_LIMIT,
        metavar="N",
        help="(group, message id) pairs per list in summary.json and report.html (default 100)",
    )
    for name in THRESHOLD_OPTIONS:
        what = name.replace("_", "-")
        p.add_argument(f"--max-{what}", type=count, metavar="N", help=f"exit 2 when {what} exceeds N")
    p.add_argument(
        "--master",
        default=default_master,
        help=f"Spark master (default {default_master or 'from spark-submit'})",
    )
    p.add_argument("--driver-memory", default="4g", help="driver JVM heap when this process starts Spark")
    p.add_argument("--shuffle-partitions", type=count, help="default: 4 per local core")
    p.add_argument("--jdbc-partitions", type=count, help="parallel range reads per table (default: cores)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "reconcile",
        help="report lost, stuck, dead and duplicated messages per consumer group (PySpark)",
        description="Reconcile stubs, each group's inbox rows, deliveries and consumer offsets; write "
        "summary.json, Parquet detail tables and report.html. Exit 2 when a --max-* threshold is crossed.",
    )
    add_arguments(p, default_master="local[*]")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> tuple[ReconcileConfig, Thresholds]:
    kwargs: dict[str, Any] = {
        "since": args.since,
        "until": args.until,
        "grace_s": args.grace,
        "stuck_after_s": args.stuck_after,
        "attention_limit": args.attention_limit,
    }
    if args.as_of is not None:
        kwargs["as_of"] = args.as_of
    retention = args.log_retention if args.log_retention is not None else Settings.load().log_retention_s
    kwargs["log_retention_s"] = retention or None
    cfg = ReconcileConfig(**kwargs)
    th = Thresholds(**{f"max_{n}": getattr(args, f"max_{n}") for n in THRESHOLD_OPTIONS})
    return cfg, th


def run(args: argparse.Namespace, spark: Any = None) -> int:
    """Run the report; returns the exit code. ``spark``: an existing session (tests, spark-submit)."""
    import os

    started = time.perf_counter()
    cfg, thresholds = config_from_args(args)
    db = args.db or (None if args.parquet else os.environ.get(C.ENV_DB_URL))
    if not db and not args.parquet:
        raise OptionError(f"no input: pass --db URL (or set {C.ENV_DB_URL}) or --parquet DIR")
    if args.parquet:
        parquet_inputs(args.parquet)  # fail before paying for a Spark start-up
    else:
        if str(db).startswith("sqlite"):
            _check_sqlite(str(db))
        else:
            from reliable.reconcile.jdbc import jdbc_target

            jdbc_target(str(db))
        check_database(str(db))
    try:
        from reliable.reconcile import io
        from reliable.reconcile.runner import Progress, reconcile
    except ModuleNotFoundError as exc:
        from reliable.reconcile.errors import SparkUnavailableError

        raise SparkUnavailableError(
            f"reconcile needs PySpark: pip install 'reliable[spark]' ({exc.name})"
        ) from exc
    horizon = cfg.complete_log_since
    if horizon is not None and cfg.until is not None and cfg.until <= horizon:
        print(
            f"reliable: note: the window ends before {horizon:%Y-%m-%d %H:%M}Z, the log retention's horizon: "
            "no offset gaps are looked for (pass --as-of the window's time, or --log-retention 0)",
            file=sys.stderr,
        )
    progress = Progress(9, enabled=not args.quiet)
    progress.step(f"starting Spark ({args.master or 'spark-submit master'})")
    if spark is None:
        spark = io.build_session(
            args.master, driver_memory=args.driver_memory, shuffle_partitions=args.shuffle_partitions or None
        )
    with tempfile.TemporaryDirectory(prefix="reliable-export-") as tmp:
        parquet_dir: Path | None = args.parquet
        source = str(args.parquet) if args.parquet else _redact(str(db))
        if db and str(db).startswith("sqlite"):
            from reliable.facade import make_engine
            from reliable.reconcile.export import export_tables

            engine = make_engine(str(db))
            try:
                export_tables(engine, Path(tmp))
            finally:
                engine.dispose()
            parquet_dir = Path(tmp)
        if parquet_dir is not None:
            inputs = io.read_parquet(spark, parquet_dir, cfg)
        else:
            inputs = io.read_jdbc(spark, str(db), cfg, partitions=args.jdbc_partitions or None)
        result = reconcile(
            spark, inputs, args.out, cfg, thresholds, source=source, progress=progress, started=started
        )
    for b in result.summary["breaches"]:
        print(
            f"reconcile: threshold crossed: {b['threshold']} = {b['value']} > {b['limit']}", file=sys.stderr
        )
    return EXIT_OK if result.ok else EXIT_THRESHOLD


def _redact(url: str) -> str:
    """The database URL without its password (it ends up in summary.json and the HTML page)."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL fails later with its own message; never print it raw
        return "<database>"


def check_database(url: str) -> None:
    """Connect with SQLAlchemy and check the schema is at the head revision, before Spark starts.

    The check ``reliable export`` makes (:func:`reliable.cli.common.ready_engine`): a wrong port, a database
    that does not exist or has no tables is one line with the ``reliable db upgrade`` hint within a second —
    not a Java exception after a Spark start-up, or (SQLite) an ``OperationalError`` half-way through the
    export. A URL without a driver (``postgresql://``, as JDBC users write it) is checked with the driver
    this package installs; Spark reads it over JDBC either way.
    """
    from sqlalchemy.engine import make_url

    from reliable.cli.common import INSTALLED_DRIVER, ready_engine

    parsed = make_url(url)
    if parsed.drivername in INSTALLED_DRIVER:
        parsed = parsed.set(drivername=INSTALLED_DRIVER[parsed.drivername])
    ready_engine(parsed.render_as_string(hide_password=False)).dispose()


def _check_sqlite(url: str) -> None:
    """A SQLite file that does not exist would be created empty by the export; say so instead."""
    from reliable.cli.common import sqlite_file  # a URI filename (file:…?uri=true) names its path

    database = sqlite_file(url)
    if database is not None and not database.exists():
        raise InputError(f"no such SQLite database: {database}")
