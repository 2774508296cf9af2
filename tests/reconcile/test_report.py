"""The report finds exactly the planted anomalies, per consumer group: from Parquet, PostgreSQL, MariaDB and
SQLite (via export)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from reliable.reconcile.rollup import LATENCY_RELATIVE_ERROR
from tests.reconcile import dataset as D
from tests.reconcile.conftest import run_report as _run
from tests.reconcile.conftest import write_database, write_parquet

# Spark runs in a JVM of its own (multi-process: `slow`); its cold start on a busy 2-core machine is slow
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]


def _pairs(out: Path, name: str) -> list[tuple[str, str]]:
    import pyarrow.parquet as pq

    t = pq.read_table(out / f"{name}.parquet")
    return sorted(
        zip(t.column("consumer_group").to_pylist(), t.column("message_id").to_pylist(), strict=True)
    )


def _table(out: Path, name: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return list(pq.read_table(out / f"{name}.parquet").to_pylist())


def _by_group(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["consumer_group"]: g for g in summary["groups"]}


def assert_exactly_planted(out: Path, summary: dict[str, Any]) -> None:
    exp = D.EXPECTED
    ds = D.build()
    for name in ("lost", "stuck", "dead", "unsent", "orphans"):
        found = _pairs(out, name)
        assert set(found) == exp[name], name
        assert len(found) == len(exp[name]), f"{name}: one row each"
    dups = sorted((r["consumer_group"], r["message_id"], r["cause"]) for r in _table(out, "duplicates"))
    assert dups == exp["duplicates"]
    gaps = sorted(
        (r["consumer_group"], r["topic"], r["queue_id"], r["gap_start"], r["gap_end"])
        for r in _table(out, "gaps")
    )
    assert gaps == exp["gaps"]

    t = summary["totals"]
    assert (t["lost"], t["stuck"], t["dead"], t["unsent"], t["orphan_logs"]) == (3, 2, 1, 2, 1)
    assert t["duplicate_deliveries"] == 11 and t["duplicate_pairs"] == 10
    assert summary["duplicates_by_cause"] == {
        "redelivery": 2, "retry": 4, "producer_double_send": 3, "targeted_resend": 2,
    }  # fmt: skip
    assert (t["gaps"], t["missing_offsets"]) == (8, 11)
    assert t["messages"] == len(ds.stubs) == 52
    assert t["inbox_rows"] == len(ds.inbox) == 144
    assert (t["pending"], t["confirmed"], t["voided"], t["dead"]) == (23, 118, 2, 1)
    assert t["deliveries"] == len(ds.logs) - 1, "every delivery but the orphan belongs to a pair"
    # lag per (group, topic, queue): audit lags on queue 0, search never consumed queue 3
    lags = {(q["consumer_group"], q["topic"], q["queue_id"]): q["lag"] for q in summary["queues"] if q["lag"]}
    assert lags == exp["lag"]
    assert t["lag"] == 14
    q1 = next(
        q for q in summary["queues"] if (q["consumer_group"], q["topic"], q["queue_id"]) == (D.B, D.T1, 1)
    )
    assert (q1["max_stub_offset"], q1["watermark"], q1["lost"], q1["stuck"]) == (12, 9, 1, 0)
    unsent = [q for q in summary["queues"] if q["queue_id"] is None]
    assert [(q["consumer_group"], q["unsent"], q["inbox_rows"]) for q in unsent] == sorted(
        [(D.A, 1, 1), (D.B, 1, 1)]
    )
    # the never-consumed alarm: search has two pending inbox rows on a queue it has no position on
    never = [
        (e["consumer_group"], e["topic"], e["queue_id"], e["inbox_rows"], e["pending"])
        for e in summary["never_consumed"]
    ]
    assert never == exp["never_consumed"] and t["never_consumed_queues"] == 1
    assert [q["never_consumed"] for q in summary["queues"]].count(True) == 1
    # every figure by group
    g = _by_group(summary)
    assert sorted(g) == sorted([D.A, D.B, D.C, D.LATE])
    figures = {
        name: (x["lost"], x["stuck"], x["dead"], x["unsent"], x["lag"], x["never_consumed_queues"])
        for name, x in g.items()
    }
    assert figures == {
        D.A: (1, 1, 1, 1, 2, 0),
        D.B: (2, 1, 0, 1, 7, 0),  # RETRY-DUE stuck; RETRY-WAIT waits for the broker's retry
        D.C: (0, 0, 0, 0, 5, 1),
        D.LATE: (0, 0, 0, 0, 0, 0),
    }
    assert {n: x["inbox_rows"] for n, x in g.items()} == {D.A: 52, D.B: 52, D.C: 39, D.LATE: 1}
    assert g[D.C]["duplicates_by_cause"] == {
        "redelivery": 0, "retry": 0, "producer_double_send": 1, "targeted_resend": 1,
    }  # fmt: skip
    assert g[D.A]["duplicates_by_cause"]["retry"] == 2 and g[D.B]["duplicate_deliveries"] == 4
    # audit: DOUBLE-1's second copy; TARGETED-1's original after its resend; the broker's retries
    assert g[D.B]["duplicates_by_cause"] == {
        "redelivery": 0, "retry": 2, "producer_double_send": 1, "targeted_resend": 1,
    }  # fmt: skip
    hist = {
        n: {r["resend_count"]: r["inbox_rows"] for r in x["targeted_resend_histogram"]} for n, x in g.items()
    }
    assert hist == {D.A: {0: 51, 7: 1}, D.B: {0: 51, 1: 1}, D.C: {0: 38, 1: 1}, D.LATE: {0: 1}}
    assert {k: v["pairs"] for k, v in summary["attention"].items()} == {
        k: [{"consumer_group": gr, "message_id": m} for gr, m in pairs]
        for k, pairs in {
            "lost": sorted([(D.B, "LOST-1"), (D.A, "REUSED-1"), (D.B, "REUSED-1")]),
            "stuck": sorted([(D.A, "STUCK-1"), (D.B, "RETRY-DUE")]),
            "dead": [(D.A, "DEAD-1")],
            "unsent": sorted([(D.A, "UNSENT-1"), (D.B, "UNSENT-1")]),
            "duplicates": sorted({(gr, m) for gr, m, _ in exp["duplicates"]}),
            "orphans": [(D.A, "ORPHAN-1")],
        }.items()
    }
    # latency: every normal pair was first delivered 50 ms and confirmed 250 ms after its message's creation
    # (percentiles come from a log-bucket sketch: within LATENCY_RELATIVE_ERROR = 0.5 % of the true value)
    lat = summary["latency_ms"]
    assert lat["send_to_first_delivery"]["p50"] == pytest.approx(50.0, rel=LATENCY_RELATIVE_ERROR)
    assert lat["send_to_confirm"]["p50"] == pytest.approx(250.0, rel=LATENCY_RELATIVE_ERROR)
    assert lat["send_to_confirm"]["count"] == 118
    assert g[D.C]["latency_ms"]["send_to_confirm"]["count"] == 39 - 5, "FRESH, BUSY, BACKLOG, NC-0, NC-1"
    assert sum(summary["latency_histogram"]["send_to_confirm"]) == 118
    assert {r["send_count"]: r["messages"] for r in summary["resend_histogram"]} == {1: 51, 2: 1}
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["totals"] == t and on_disk["schema_version"] == 3


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
    """W-SPLIT is created and first delivered inside the window and delivered again (to billing) after it."""
    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig

    cfg = ReconcileConfig(as_of=D.AS_OF, since=D.WINDOW[0], until=D.WINDOW[1])
    src = write_parquet(planted, tmp_path / "in")
    result = _run(spark, io.read_parquet(spark, src, cfg), tmp_path / "out", cfg)
    t = result.summary["totals"]
    assert (t["messages"], t["inbox_rows"]) == (1, 2)
    assert t["deliveries"] == 3, "billing's delivery after `until` still belongs to the message"
    dups = _table(tmp_path / "out", "duplicates")
    assert sorted((r["consumer_group"], r["message_id"], r["cause"]) for r in dups) == [
        (D.A, "W-SPLIT", "redelivery")
    ]
    # EARLY-1 (created before the window, delivered inside it) is neither reported nor an orphan
    assert t["orphan_logs"] == 0 and _pairs(tmp_path / "out", "orphans") == []
    assert (t["lost"], t["stuck"], t["dead"], t["unsent"], t["gaps"]) == (0, 0, 0, 0, 0)
    assert t["never_consumed_queues"] == 0
    assert result.summary["window"] == {"since": "2026-11-20T10:10:00Z", "until": "2026-11-20T10:30:00Z"}


def test_attention_lists_keep_the_first_pairs_and_count_them_all(
    spark: Any, planted: D.Dataset, tmp_path: Path
) -> None:
    """With a limit of one pair per list, each list shows its first pair (by group, then message id) and
    its total."""
    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig

    cfg = ReconcileConfig(as_of=D.AS_OF, attention_limit=1)
    src = write_parquet(planted, tmp_path / "in")
    summary = _run(spark, io.read_parquet(spark, src, cfg), tmp_path / "out", cfg).summary
    exp = D.EXPECTED
    expected = {name: exp[name] for name in ("lost", "stuck", "dead", "unsent", "orphans")}
    expected["duplicates"] = {(gr, m) for gr, m, _ in exp["duplicates"]}
    for name, pairs in expected.items():
        entry = summary["attention"][name]
        assert entry["total"] == len(pairs), name
        first = min(pairs)
        assert entry["pairs"] == [{"consumer_group": first[0], "message_id": first[1]}], name


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
        "--max-lost", "0", "--max-stuck", "5", "--max-duplicates", "7", "--max-never-consumed", "0",
    )  # fmt: skip
    assert run(args, spark=spark) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert_exactly_planted(out, summary)
    assert [b["threshold"] for b in summary["breaches"]] == [
        "max_lost",
        "max_duplicates",
        "max_never_consumed",
    ]
    err = capsys.readouterr().err
    assert "threshold crossed: max_lost = 3 > 0" in err
    assert "threshold crossed: max_duplicates = 11 > 7" in err
    assert "threshold crossed: max_never_consumed = 1 > 0" in err
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
    assert summary["queues"] == [] and summary["groups"] == [] and summary["never_consumed"] == []
    assert summary["breaches"] == [] and summary["ok"] is True
    assert summary["latency_ms"]["send_to_first_delivery"] == {
        "count": 0, "p50": None, "p95": None, "p99": None, "max": None,
    }  # fmt: skip
    for name in ("lost", "stuck", "dead", "unsent", "duplicates", "orphans", "gaps"):
        assert _table(out, name) == []
    assert "no queues" in (out / "report.html").read_text()
    assert capsys.readouterr().err == ""


def test_queue_0_of_two_broker_groups_is_two_queues(spark: Any, tmp_path: Path) -> None:
    """On a RocketMQ cluster broker-a's queue 0 and broker-b's queue 0 have their own offsets: a message
    waiting on broker-b is not lost because broker-a's queue 0 is far ahead, and broker-b's own watermark
    still proves a loss there (schema_version 3: queues carry ``broker_name``)."""
    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig

    ds = D.Dataset()

    def message(mid: str, broker: str, offset: int, delivered: bool) -> None:
        created = ds.stub(mid, 0, offset, status="CONFIRMED" if delivered else "PENDING")
        ds.stubs[-1]["broker_name"] = broker
        ds.row(D.A, mid, "CONFIRMED" if delivered else "PENDING", created)
        if delivered:
            ds.log(D.A, mid, 0, offset, created + dt.timedelta(seconds=1))
            ds.logs[-1]["broker_name"] = broker

    for i in range(10):
        message(f"a{i}", "broker-a", i, True)  # broker-a queue 0 consumed up to 9
    message("b0", "broker-b", 0, True)
    message("b-lost", "broker-b", 1, False)  # broker-b moved past it (offset 2): lost
    message("b2", "broker-b", 2, True)
    message("b-waits", "broker-b", 3, False)  # below broker-a's 9, above broker-b's 2: queued
    ds.finish_progress()
    cfg = ReconcileConfig(as_of=D.AS_OF)
    src = write_parquet(ds, tmp_path / "in")
    summary = _run(spark, io.read_parquet(spark, src, cfg), tmp_path / "out", cfg).summary
    assert summary["schema_version"] == 3
    queues = {(q["broker_name"], q["queue_id"]): q for q in summary["queues"]}
    assert set(queues) == {("broker-a", 0), ("broker-b", 0)}
    assert (queues["broker-a", 0]["watermark"], queues["broker-b", 0]["watermark"]) == (9, 2)
    assert (queues["broker-a", 0]["lost"], queues["broker-b", 0]["lost"]) == (0, 1)
    assert queues["broker-b", 0]["lag"] == 1 and queues["broker-b", 0]["pending"] == 2
    assert summary["totals"]["lost"] == 1


def test_a_healthy_group_without_broker_names_and_a_retired_group_raise_no_alarm(
    spark: Any, tmp_path: Path
) -> None:
    """Two broker groups. Billing consumes through a client that cannot name the broker group (RocketMQ
    4.x's): its positions are kept under ``''``, and it confirmed every message. Search was retired
    (``retire_group``: its rows VOIDED) and never consumed. Neither owes anything: no never-consumed queue,
    no lag — the sweeper counts such an unnamed position as "consumed here" too (``sweeper/queues.py``).
    Audit still owes a message on a queue it never consumed: that alarm stays."""
    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig

    ds = D.Dataset()
    for broker in ("broker-a", "broker-b"):
        for offset in range(3):
            mid = f"{broker}-{offset}"
            created = ds.stub(mid, 0, offset)
            ds.stubs[-1]["broker_name"] = broker
            ds.row(D.A, mid, "CONFIRMED", created)
            ds.row(D.C, mid, "VOIDED", created)
            ds.log(D.A, mid, 0, offset, created + dt.timedelta(seconds=1))  # broker_name '': unnamed
    owed = ds.stub("owed", 1, 0, status="PENDING")
    ds.stubs[-1]["broker_name"] = "broker-a"
    ds.row(D.B, "owed", "PENDING", owed)
    ds.finish_progress()
    assert {p["broker_name"] for p in ds.progress} == {""}
    cfg = ReconcileConfig(as_of=D.AS_OF)
    summary = _run(
        spark, io.read_parquet(spark, write_parquet(ds, tmp_path / "in"), cfg), tmp_path / "out", cfg
    )
    groups = _by_group(summary.summary)
    assert (groups[D.A]["confirmed"], groups[D.A]["never_consumed_queues"], groups[D.A]["lag"]) == (6, 0, 0)
    assert (groups[D.C]["voided"], groups[D.C]["never_consumed_queues"], groups[D.C]["lag"]) == (6, 0, 0)
    assert (groups[D.B]["never_consumed_queues"], groups[D.B]["lag"]) == (1, 1)
    assert [
        (e["consumer_group"], e["broker_name"], e["queue_id"]) for e in summary.summary["never_consumed"]
    ] == [(D.B, "broker-a", 1)]
    assert summary.summary["totals"]["never_consumed_queues"] == 1


def test_a_window_counts_the_duplicates_of_its_own_messages_only(spark: Any, tmp_path: Path) -> None:
    """Three messages, each delivered twice to billing; the window holds the middle one. The log is read
    from a little before the window with no upper end, so the later message's redelivery is read too — it
    is not the window's. Nor is a redelivery of a message without a stub (an orphan log already)."""
    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig

    ds = D.Dataset()
    for mid, minutes, offset in (("m-before", 150, 0), ("m-in", 100, 1), ("m-after", 60, 2)):
        created = ds.stub(mid, 0, offset, created=D.ago(minutes))
        ds.row(D.A, mid, "CONFIRMED", created)
        for s in (1, 30):
            ds.log(D.A, mid, 0, offset, created + dt.timedelta(seconds=s))
    for s in (1, 30):
        ds.log(D.A, "no-stub", 0, 3, D.ago(59) + dt.timedelta(seconds=s))
    ds.finish_progress()
    cfg = ReconcileConfig(as_of=D.AS_OF, since=D.WINDOW[0], until=D.WINDOW[1])
    summary = _run(
        spark, io.read_parquet(spark, write_parquet(ds, tmp_path / "in"), cfg), tmp_path / "out", cfg
    )
    t = summary.summary["totals"]
    assert (t["messages"], t["deliveries"]) == (1, 2)
    assert (t["duplicate_deliveries"], t["duplicate_pairs"]) == (1, 1)
    assert [(r["message_id"], r["cause"]) for r in _table(tmp_path / "out", "duplicates")] == [
        ("m-in", "redelivery")
    ]
    # the timeline too: the window's minutes and deliveries only, not the later message's or the orphan's
    minutes = summary.summary["timeline"]["all"]
    window = [(D.WINDOW[0] + dt.timedelta(minutes=m)).strftime("%Y-%m-%dT%H:%MZ") for m in range(20)]
    assert {p["minute"] for p in minutes} <= set(window), [p["minute"] for p in minutes]
    assert sum(p["deliveries"] for p in minutes) == 2
    assert sum(sum(p["duplicates"].values()) for p in minutes) == 1
