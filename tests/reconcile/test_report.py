"""The report finds exactly the planted anomalies: from Parquet, PostgreSQL, MariaDB, SQLite (via export)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from tests.reconcile import dataset as D
from tests.reconcile.conftest import run_report as _run
from tests.reconcile.conftest import write_database, write_parquet

# Spark runs in a JVM of its own (multi-process: `slow`); its cold start on a busy 2-core machine is slow
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]


def _ids(out: Path, name: str) -> list[str]:
    import pyarrow.parquet as pq

    return sorted(pq.read_table(out / f"{name}.parquet").column("message_id").to_pylist())


def _table(out: Path, name: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return list(pq.read_table(out / f"{name}.parquet").to_pylist())


def assert_exactly_planted(out: Path, summary: dict[str, Any]) -> None:
    exp = D.EXPECTED
    for name in ("lost", "stuck", "dead", "unsent", "orphans"):
        assert set(_ids(out, name)) == exp[name], name
        assert len(_ids(out, name)) == len(exp[name]), f"{name}: one row each"
    dups = sorted((r["message_id"], r["cause"]) for r in _table(out, "duplicates"))
    assert dups == exp["duplicates"]
    gaps = sorted(
        (r["consumer_group"], r["topic"], r["queue_id"], r["gap_start"], r["gap_end"])
        for r in _table(out, "gaps")
    )
    assert gaps == exp["gaps"]

    t = summary["totals"]
    assert (t["lost"], t["stuck"], t["dead"], t["unsent"], t["orphan_logs"]) == (1, 1, 1, 1, 1)
    assert t["duplicate_deliveries"] == 5 and t["duplicate_messages"] == 4
    assert summary["duplicates_by_cause"] == {"redelivery": 2, "retry": 2, "producer_double_send": 1}
    assert (t["gaps"], t["missing_offsets"]) == (4, 5)
    assert t["stubs"] == 37
    assert (t["pending"], t["confirmed"], t["voided"], t["dead"]) == (6, 29, 1, 1)
    # only queue 1 has a stub beyond the watermark (BACKLOG-1 at 12, watermark 10)
    lags = {(q["consumer_group"], q["queue_id"]): q["lag"] for q in summary["queues"] if q["lag"]}
    assert lags == {(D.G1, 1): 2}
    assert t["lag"] == 2
    q1 = next(q for q in summary["queues"] if (q["consumer_group"], q["queue_id"]) == (D.G1, 1))
    assert (q1["max_stub_offset"], q1["watermark"], q1["lost"], q1["stuck"]) == (12, 10, 1, 1)
    unsent = next(q for q in summary["queues"] if q["queue_id"] is None)
    assert unsent["unsent"] == 1 and unsent["stubs"] == 1
    assert {k: v["message_ids"] for k, v in summary["attention"].items()} == {
        "lost": ["LOST-1"],
        "stuck": ["STUCK-1"],
        "dead": ["DEAD-1"],
        "unsent": ["UNSENT-1"],
        "duplicates": ["DOUBLE-1", "REDELIVER-1", "RETRY-1", "W-SPLIT"],
        "orphans": ["ORPHAN-1"],
    }
    # latency: every normal message was first delivered 50 ms and confirmed 250 ms after creation
    lat = summary["latency_ms"]
    assert lat["send_to_first_delivery"]["p50"] == pytest.approx(50.0)
    assert lat["send_to_confirm"]["p50"] == pytest.approx(250.0)
    assert lat["send_to_confirm"]["count"] == 29
    assert sum(summary["latency_histogram"]["send_to_confirm"]) == 29
    assert {r["send_count"]: r["stubs"] for r in summary["resend_histogram"]} == {1: 35, 2: 1, 8: 1}
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["totals"] == t and on_disk["schema_version"] == 1


def test_parquet_input_finds_exactly_the_planted_anomalies(parquet_report: Any) -> None:
    assert_exactly_planted(parquet_report.out_dir, parquet_report.summary)
    assert parquet_report.ok  # no thresholds given


@pytest.mark.parametrize("backend", ["postgres", "mariadb"])
def test_jdbc_input_finds_exactly_the_planted_anomalies(
    backend: str, spark: Any, planted: D.Dataset, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig

    url: str = request.getfixturevalue(f"{backend}_url")
    write_database(planted, url)
    cfg = ReconcileConfig(as_of=D.AS_OF)
    result = _run(spark, io.read_jdbc(spark, url, cfg, partitions=2), tmp_path, cfg)
    assert_exactly_planted(tmp_path, result.summary)


def test_window_keeps_a_messages_deliveries_together(spark: Any, planted: D.Dataset, tmp_path: Path) -> None:
    """W-SPLIT is created and first delivered inside the window and delivered again after it."""
    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig

    cfg = ReconcileConfig(as_of=D.AS_OF, since=D.WINDOW[0], until=D.WINDOW[1])
    src = write_parquet(planted, tmp_path / "in")
    result = _run(spark, io.read_parquet(spark, src, cfg), tmp_path / "out", cfg)
    t = result.summary["totals"]
    assert t["stubs"] == 1
    assert t["deliveries"] == 2, "the delivery after `until` still belongs to the message"
    assert sorted((r["message_id"], r["cause"]) for r in _table(tmp_path / "out", "duplicates")) == [
        ("W-SPLIT", "redelivery")
    ]
    # EARLY-1 (created before the window, delivered inside it) is neither reported nor an orphan
    assert t["orphan_logs"] == 0 and _ids(tmp_path / "out", "orphans") == []
    assert (t["lost"], t["stuck"], t["dead"], t["unsent"], t["gaps"]) == (0, 0, 0, 0, 0)
    assert result.summary["window"] == {"since": "2026-11-20T10:10:00Z", "until": "2026-11-20T10:30:00Z"}


def _cli_args(*argv: str) -> argparse.Namespace:
    from reliable.cli import build_parser

    return build_parser().parse_args(["reconcile", *argv])


def test_cli_on_sqlite_exits_2_when_a_threshold_is_crossed(
    spark: Any, planted: D.Dataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reliable.cli.reconcile import run

    sqlite_url = f"sqlite:///{tmp_path / 'planted.db'}"
    write_database(planted, sqlite_url)
    out = tmp_path / "out"
    args = _cli_args(
        "--db", sqlite_url, "--out", str(out), "--as-of", D.AS_OF.isoformat(),
        "--max-lost", "0", "--max-stuck", "5", "--max-duplicates", "4",
    )  # fmt: skip
    assert run(args, spark=spark) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert_exactly_planted(out, summary)
    assert [b["threshold"] for b in summary["breaches"]] == ["max_lost", "max_duplicates"]
    err = capsys.readouterr().err
    assert "threshold crossed: max_lost = 1 > 0" in err
    assert "threshold crossed: max_duplicates = 5 > 4" in err
    assert "reconcile [1/9]" in err, "progress is shown on the console"
    assert (out / "report.html").read_text().count("ALERT") == 1


def test_empty_database_reports_zeros_and_exits_0(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reliable.cli.reconcile import run

    sqlite_url = f"sqlite:///{tmp_path / 'empty.db'}"
    write_database(D.Dataset(), sqlite_url)
    out = tmp_path / "out"
    args = _cli_args("--db", sqlite_url, "--out", str(out), "--max-lost", "0", "--max-stuck", "0", "-q")
    assert run(args, spark=spark) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert all(v == 0 for v in summary["totals"].values())
    assert summary["queues"] == [] and summary["breaches"] == [] and summary["ok"] is True
    assert summary["latency_ms"]["send_to_first_delivery"] == {
        "count": 0, "p50": None, "p95": None, "p99": None, "max": None,
    }  # fmt: skip
    for name in ("lost", "stuck", "dead", "unsent", "duplicates", "orphans", "gaps"):
        assert _table(out, name) == []
    assert "no queues" in (out / "report.html").read_text()
    assert capsys.readouterr().err == ""
