"""The timeline: per minute, what arrived, which arrivals were duplicates and why, what was re-sent, the
latency and the backlog (Spark, local[2]).

The inputs are what the job gives the timeline — every delivery, the extra deliveries with their cause, and
the pairs counted by the job's own one-scan aggregation (``sketch_and_timeline_counts`` → ``timeline_rows``)
— built here from plain rows with only the columns those read; the full pipeline (those frames from the
tables) runs in test_report.py / test_html.py.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from reliable.reconcile.rollup import LATENCY_RELATIVE_ERROR
from reliable.reconcile.timeline import timeline_summary

T0 = dt.datetime(2026, 11, 20, 11, 30, tzinfo=dt.UTC)
G1, G2 = "billing", "audit"


def at(minute: int, second: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minute, seconds=second)


def delivery(group: str, received: dt.datetime, cause: str | None = None) -> dict[str, Any]:
    return {"consumer_group": group, "received_at": received, "cause": cause}


def row(
    group: str,
    created: dt.datetime,
    first: dt.datetime | None,
    sends: int = 1,
    last_sent: dt.datetime | None = None,
) -> dict[str, Any]:
    ms = None if first is None else (first - created).total_seconds() * 1000
    return {
        "deliveries": 0 if first is None else 1,
        "consumer_group": group,
        "topic": "orders",
        "broker_name": "",
        "queue_id": 0,
        "created_at": created,
        "first_received_at": first,
        "first_delivery_ms": ms,
        "confirm_ms": None,
        "send_count": sends,
        "last_sent_at": last_sent or created,
    }


@pytest.mark.spark
@pytest.mark.slow
def test_per_minute_figures(spark: Any) -> None:
    from reliable.reconcile.aggregates import sketch_and_timeline_counts, timeline_rows
    from reliable.reconcile.timeline import timeline_frame

    arrivals = [
        delivery(G1, at(0, 10)),  # A, first delivery 5 s after creation
        delivery(G1, at(1, 20), "retry"),  # A again: the consumer asked for a retry
        delivery(G1, at(2, 5)),  # B, 95 s after creation
        delivery(G1, at(2, 30), "producer_double_send"),  # B at another offset
        delivery(G2, at(0, 41)),  # E, another group
    ]
    schema = "consumer_group string, received_at timestamp, cause string"
    deliveries = spark.createDataFrame(arrivals, schema).drop("cause")
    duplicates = spark.createDataFrame([d for d in arrivals if d["cause"]], schema)
    pairs = spark.createDataFrame(
        [
            row(G1, at(0, 5), at(0, 10)),  # A
            row(G1, at(0, 30), at(2, 5), sends=2, last_sent=at(2, 0)),  # B, re-sent at minute 2
            row(G1, at(1, 0), None),  # C, never delivered: the backlog stays up
            row(G2, at(0, 40), at(0, 41)),  # E
        ],
        "deliveries int, consumer_group string, topic string, broker_name string, queue_id int, "
        "created_at timestamp, "
        "first_received_at timestamp, first_delivery_ms double, confirm_ms double, send_count int, "
        "last_sent_at timestamp",
    )
    counted = timeline_rows(sketch_and_timeline_counts(pairs))
    frame = timeline_frame(deliveries, duplicates, counted)
    timeline = timeline_summary(r.asDict() for r in frame.collect())

    g1 = timeline["groups"][G1]
    assert [p["minute"][-6:] for p in g1] == ["11:30Z", "11:31Z", "11:32Z"]
    assert [p["deliveries"] for p in g1] == [1, 1, 2]
    assert [p["duplicates"]["retry"] for p in g1] == [0, 1, 0]
    assert [p["duplicates"]["producer_double_send"] for p in g1] == [0, 0, 1]
    assert [p["resends"] for p in g1] == [0, 0, 1]
    assert [p["backlog"] for p in g1] == [1, 2, 1], "A and B staged, A delivered; C staged; B delivered"
    p95 = [p["p95_ms"] for p in g1]
    assert p95[1] is None, "nothing was first delivered at minute 1"
    for got, exact in ((p95[0], 5000.0), (p95[2], 95000.0)):  # read from log buckets: within the stated error
        assert got is not None and abs(got - exact) <= LATENCY_RELATIVE_ERROR * exact, (got, exact)
    everything = timeline["all"]
    assert [p["deliveries"] for p in everything] == [2, 1, 2], "all groups: E counts at minute 0"
    assert [p["backlog"] for p in everything] == [1, 2, 1]
    assert [p["deliveries"] for p in timeline["groups"][G2]] == [1]


@pytest.mark.spark
def test_minutes_are_utc_whatever_the_drivers_time_zone(spark: Any) -> None:
    """``collect()`` gives a timestamp as a naive datetime in the Python process's zone: a driver on
    Asia/Kolkata showed every minute 5:30 late. The frame hands over epoch seconds instead."""
    import os
    import time

    from reliable.reconcile.timeline import timeline_frame

    zone = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Kolkata"
    time.tzset()
    try:
        schema = "consumer_group string, received_at timestamp, cause string"
        deliveries = spark.createDataFrame([delivery(G1, at(0, 10))], schema).drop("cause")
        counted = spark.createDataFrame(
            [], "consumer_group string, kind byte, minute timestamp, bucket int, n long"
        )
        frame = timeline_frame(deliveries, spark.createDataFrame([], schema), counted)
        timeline = timeline_summary(r.asDict() for r in frame.collect())
    finally:
        if zone is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = zone
        time.tzset()
    assert [p["minute"] for p in timeline["groups"][G1]] == ["2026-11-20T11:30Z"]
    with pytest.raises(ValueError, match="no time zone"):
        timeline_summary([{"consumer_group": G1, "minute": dt.datetime(2026, 11, 20, 11, 30)}])


def test_quiet_minutes_are_zero_and_only_the_newest_are_kept() -> None:
    from reliable.reconcile.timeline import MAX_MINUTES

    start = dt.datetime(2026, 11, 20, 0, 0, tzinfo=dt.UTC)
    rows = [
        {"consumer_group": "*", "minute": start, "deliveries": 3, "staged": 5, "first_delivered": 3},
        {"consumer_group": "*", "minute": start + dt.timedelta(minutes=MAX_MINUTES + 9), "deliveries": 1},
    ]
    points = timeline_summary(rows)["all"]
    assert len(points) == MAX_MINUTES and points[-1]["deliveries"] == 1
    assert all(p["deliveries"] == 0 for p in points[:-1]), "the quiet minutes in between are zeros"
    assert {p["backlog"] for p in points} == {2}, "the backlog carries over the quiet minutes"


@pytest.mark.spark
@pytest.mark.slow
def test_a_confirmed_pair_whose_journal_was_purged_leaves_the_backlog_at_its_confirmation(
    spark: Any, tmp_path: Any
) -> None:
    """After the log retention purged a confirmed pair's deliveries, the pair is still delivered: it leaves
    the backlog when it was confirmed (until 2026-11-29 it stayed there for ever, so the backlog grew by
    every message older than the retention). A window over purged days says so instead of showing every
    pair confirmed, zero deliveries and a backlog of all of them (the long-run hunt's S3)."""
    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig
    from reliable.reconcile.report_html import render_html
    from tests.reconcile import dataset as D
    from tests.reconcile.conftest import run_report, write_parquet

    old = D.AS_OF - dt.timedelta(days=10)
    ds = D.Dataset()
    for i in range(20):  # ten days old, confirmed by three groups; the purge left no journal row
        created = ds.stub(f"a-{i:02d}", 0, i, created=old + dt.timedelta(seconds=i))
        for group in D.ALL:
            ds.row(group, f"a-{i:02d}", "CONFIRMED", created)
    for i in range(3):  # this hour's: delivered and journaled
        D.normal(ds, f"b-{i}", 0, 20 + i)
    ds.finish_progress()
    src = write_parquet(ds, tmp_path / "in")

    cfg = ReconcileConfig(as_of=D.AS_OF)
    everything = run_report(spark, io.read_parquet(spark, src, cfg), tmp_path / "all", cfg).summary
    points = everything["timeline"]["all"]
    assert {p["backlog"] for p in points} == {0}, "every pair was delivered (confirmed)"
    assert everything["timeline"]["journal"] == {
        "first_delivery": "2026-11-20T10:00Z",
        "unlogged_confirmed": 60,
    }

    cfg = ReconcileConfig(as_of=D.AS_OF, since=old - dt.timedelta(days=1), until=old + dt.timedelta(days=1))
    window = run_report(spark, io.read_parquet(spark, src, cfg), tmp_path / "window", cfg).summary
    assert (window["totals"]["confirmed"], window["totals"]["deliveries"]) == (60, 0)
    assert [p["backlog"] for p in window["timeline"]["all"]] == [0]
    assert window["timeline"]["journal"] == {"first_delivery": None, "unlogged_confirmed": 60}
    page = render_html(window)
    assert "Journal purged: 60 confirmed (group, message) pairs" in page
    assert "Journal purged" not in render_html(
        {**window, "timeline": {**window["timeline"], "journal": None}}
    )
