"""The parts without Spark: options, thresholds, the summary, the export, the CLI's one-line errors."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reliable.reconcile.config import ReconcileConfig, Thresholds
from reliable.reconcile.errors import OptionError, ReconcileError
from reliable.reconcile.summary import Collected, Row, build_summary, evaluate_thresholds
from tests.reconcile import dataset as D
from tests.reconcile.conftest import write_database

ROOT = Path(__file__).resolve().parents[2]


def test_reconcile_errors_derive_from_the_package_root() -> None:
    from reliable.errors import ReliableError

    assert issubclass(ReconcileError, ReliableError) and issubclass(OptionError, ReconcileError)


def test_importing_reliable_does_not_import_pyspark() -> None:
    code = "import sys, reliable, reliable.reconcile, reliable.cli; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_config_rejects_naive_times_and_inverted_windows() -> None:
    with pytest.raises(OptionError, match="timezone-aware"):
        ReconcileConfig(as_of=dt.datetime(2026, 1, 1))
    with pytest.raises(OptionError, match="before until"):
        ReconcileConfig(since=D.AS_OF, until=D.AS_OF)
    with pytest.raises(OptionError, match="max-lost"):
        Thresholds(max_lost=-1)


def test_duration_and_timestamp_options() -> None:
    from reliable.cli.reconcile import duration, timestamp

    assert [duration(x) for x in ("90", "90s", "15m", "2h", "1d", "250ms")] == [
        90,
        90,
        900,
        7200,
        86400,
        0.25,
    ]
    assert timestamp("2026-11-20T12:00:00Z") == D.AS_OF
    assert timestamp("2026-11-20 12:00") == D.AS_OF, "no offset means UTC"
    assert timestamp("2026-11-20T14:00:00+02:00") == D.AS_OF
    for bad in ("soon", "-5m", "5 minutes"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        timestamp("yesterday")


@given(
    counts=st.dictionaries(st.sampled_from(["max_lost", "max_stuck", "max_dead"]), st.integers(0, 50)),
    limits=st.dictionaries(st.sampled_from(["max_lost", "max_stuck", "max_dead"]), st.integers(0, 50)),
)
def test_a_threshold_is_breached_exactly_when_the_count_exceeds_it(
    counts: dict[str, int], limits: dict[str, int]
) -> None:
    breaches = evaluate_thresholds(counts, Thresholds(**limits))
    expected = {k for k, lim in limits.items() if counts.get(k, 0) > lim}
    assert {b["threshold"] for b in breaches} == expected
    assert all(b["value"] > b["limit"] for b in breaches)


def test_summary_of_nothing_has_every_key_and_zero_counts() -> None:
    s = build_summary(Collected(), ReconcileConfig(as_of=D.AS_OF), Thresholds(max_lost=0), source="x")
    assert s["schema_version"] == 3 and s["ok"] is True and s["as_of"] == "2026-11-20T12:00:00Z"
    assert set(s) >= {
        "totals", "queues", "groups", "never_consumed", "duplicates_by_cause", "latency_ms",
        "latency_histogram", "resend_histogram", "attention", "thresholds", "breaches", "window", "settings",
    }  # fmt: skip
    assert all(v == 0 for v in s["totals"].values())
    assert s["duplicates_by_cause"] == {
        "redelivery": 0, "retry": 0, "producer_double_send": 0, "targeted_resend": 0,
    }  # fmt: skip


def test_lag_is_offsets_beyond_the_watermark() -> None:
    rows: list[Row] = [
        {
            "consumer_group": g,
            "topic": "t",
            "queue_id": q,
            "level": "queue",
            "inbox_rows": 3,
            "max_stub_offset": m,
        }
        for g, q, m in (("g", 0, 9), ("g", 1, 4), ("g", 2, 0), ("h", 0, 9))
    ]
    progress: list[Row] = [
        {"consumer_group": "g", "topic": "t", "queue_id": 0, "max_offset": 6},
        {"consumer_group": "g", "topic": "t", "queue_id": 1, "max_offset": 7},
        {"consumer_group": "h", "topic": "t", "queue_id": 0, "max_offset": 9},
    ]
    s = build_summary(
        Collected(pair_stats=rows, progress=progress), ReconcileConfig(), Thresholds(), source="x"
    )
    # queue 2 has no consumer position at all: its one offset (0) is lag; each group has its own watermark
    assert [q["lag"] for q in s["queues"]] == [3, 0, 1, 0]
    assert {g["consumer_group"]: g["lag"] for g in s["groups"]} == {"g": 4, "h": 0}


def test_export_streams_tables_in_chunks(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from reliable.facade import make_engine
    from reliable.reconcile.export import export_tables

    url = f"sqlite:///{tmp_path / 'x.db'}"
    ds = D.build()
    write_database(ds, url)
    engine = make_engine(url)
    try:
        result = export_tables(engine, tmp_path / "out", chunk_rows=7)
    finally:
        engine.dispose()
    assert result.rows == {
        "message_stub": 52,
        "message_inbox": 144,
        "message_log": len(ds.logs),
        "consume_progress": len(ds.progress),
    }
    stub = pq.ParquetFile(tmp_path / "out" / "message_stub.parquet")
    assert stub.metadata.num_row_groups == 8, "52 rows in chunks of 7"
    assert "content" not in stub.schema_arrow.names
    rows = {r["message_id"]: r for r in stub.read().to_pylist()}
    assert rows["LOST-1"]["status"] == "PENDING" and rows["LOST-1"]["created_at"] == D.ago(60)
    assert rows["UNSENT-1"]["queue_offset"] is None
    inbox = pq.read_table(tmp_path / "out" / "message_inbox.parquet").to_pylist()
    lost = {(r["consumer_group"], r["status"]) for r in inbox if r["message_id"] == "LOST-1"}
    assert lost == {(D.A, "CONFIRMED"), (D.B, "PENDING"), (D.C, "CONFIRMED")}
    log = pq.read_table(tmp_path / "out" / "message_log.parquet").to_pylist()
    assert {(r["topic"], r["original_topic"]) for r in log if r["reconsume_times"]} == {
        ("%RETRY%billing", "orders"),
        ("%RETRY%audit", "payments"),
    }
    assert {r["outcome"] for r in log if r["message_id"] == "RETRY-DUE"} == {"RETRY", "SUCCESS"}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reliable.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--parquet", "/nonexistent", "--out", "/tmp/x"], "Parquet input incomplete"),
        (
            ["--parquet", ".", "--out", "/tmp/x", "--since", "2026-01-02", "--until", "2026-01-01"],
            "must be before until",
        ),
        (["--db", "oracle://u@h/db", "--out", "/tmp/x"], "unsupported database"),
        (["--db", "sqlite:////nonexistent/x.db", "--out", "/tmp/x"], "no such SQLite database"),
    ],
)
def test_cli_bad_input_is_one_line_before_spark_starts(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from reliable.cli import main

    assert main(["reconcile", *args]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("reliable: error:"), err


def test_export_cli_writes_the_four_files(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    write_database(D.build(), url)
    res = _cli("export", "--to", str(tmp_path / "pq"), "--db", url, "-q")
    assert res.returncode == 0, res.stderr
    assert "message_stub 52" in res.stdout and "message_inbox 144" in res.stdout
    assert sorted(p.name for p in (tmp_path / "pq").iterdir()) == [
        "consume_progress.parquet", "message_inbox.parquet", "message_log.parquet", "message_stub.parquet",
    ]  # fmt: skip


def test_spark_submit_entry_point_reports_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from jobs.reconcile import main

    assert main(["--parquet", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reconcile: error: Parquet input incomplete")


def _empty_sqlite(directory: Path) -> str:
    import sqlite3

    path = directory / "empty.db"
    with sqlite3.connect(path) as conn:  # a database file, but not one of ours: no reliable tables
        conn.execute("CREATE TABLE other (x INTEGER)")
    return f"sqlite:///{path}"


def _no_spark(*args: object, **kwargs: object) -> Any:
    raise AssertionError("Spark was started before the database was checked")


@pytest.mark.parametrize("where", ["sqlite without tables", "postgres wrong port", "postgres without schema"])
def test_cli_database_not_ready_is_one_line_before_spark_starts(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check `reliable export` makes: one line with the upgrade hint, exit 2, and no Spark start-up."""
    pytest.importorskip("pyspark")
    from reliable.cli import main
    from tests import services

    monkeypatch.setattr("reliable.reconcile.io.build_session", _no_spark)
    with contextlib.ExitStack() as stack:
        if where.startswith("sqlite"):
            url = _empty_sqlite(tmp_path)
        elif where == "postgres wrong port":
            url = "postgresql://reader@127.0.0.1:1/app"  # no driver named, as JDBC users write it
        else:
            url = stack.enter_context(services.scratch_database("postgres"))
        assert main(["reconcile", "--db", url, "--out", str(tmp_path / "out"), "-q"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reliable: error:"), lines
    assert "run `reliable db upgrade --db URL` first" in lines[0], lines


def test_spark_submit_entry_point_reports_a_database_without_tables_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyspark")
    from jobs.reconcile import main

    monkeypatch.setattr("reliable.reconcile.io.build_session", _no_spark)
    assert main(["--db", _empty_sqlite(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no reliable schema" in err[0], err


def test_spark_submit_entry_point_reports_a_database_error_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table gone between the check and the read: SQLAlchemy's error, one line, not a traceback."""
    from sqlalchemy.exc import OperationalError

    from jobs.reconcile import main

    def gone(args: argparse.Namespace) -> int:
        raise OperationalError("SELECT … FROM message_stub", {}, Exception("no such table: message_stub"))

    monkeypatch.setattr("reliable.cli.reconcile.run", gone)
    assert main(["--parquet", "x", "--out", "y"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reconcile: error: OperationalError:"), err
    assert "no such table: message_stub" in err[0], err
