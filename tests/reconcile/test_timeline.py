"""The timeline: per minute, what arrived, which arrivals were duplicates and why, what was re-sent, the
latency and the backlog — from the same tables the rest of the report reads (Spark, local[2])."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from reliable.reconcile.config import ReconcileConfig
from reliable.reconcile.timeline import timeline_summary
from tests.reconcile import dataset as D
from tests.reconcile.conftest import write_parquet

T0 = D.AS_OF - dt.timedelta(minutes=30)


def at(minute: int, second: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minute, seconds=second)


@pytest.mark.spark
@pytest.mark.slow
def test_per_minute_figures(spark: Any, tmp_path: Path) -> None:
    from reliable.reconcile import transforms as T
    from reliable.reconcile.io import read_parquet
    from reliable.reconcile.timeline import timeline_frame

    ds = D.Dataset()
    ds.stub("A", 0, 10, created=at(0, 5))
    ds.log("A", 0, 10, at(0, 10))  # first delivery 5 s after creation
    ds.log("A", 0, 10, at(1, 20), reconsume=1)  # a retry of the same offset
    ds.stub("B", 1, 20, created=at(0, 30), send_count=2)
    ds.stubs[-1]["last_sent_at"] = at(2, 0)  # re-sent at minute 2
    ds.log("B", 1, 21, at(2, 5))  # delivered 95 s after creation
    ds.log("B", 1, 20, at(2, 30))  # … and the original send: another offset, a producer double send
    ds.stub("C", 0, 11, status="PENDING", created=at(1, 0))  # never delivered: the backlog stays up
    ds.stub("E", 2, 5, created=at(0, 40), group=D.G2, topic=D.T2)
    ds.log("E", 2, 5, at(0, 41), group=D.G2, topic=D.T2)
    ds.finish_progress()
    cfg = ReconcileConfig(as_of=D.AS_OF)
    inputs = read_parquet(spark, write_parquet(ds, tmp_path / "in"), cfg)
    classified = T.classify_deliveries(inputs.logs)
    joined = T.join_stubs_deliveries(inputs.stubs, T.delivery_stats(classified))
    enriched = T.enrich_stubs(joined, inputs.progress, cfg)
    timeline = timeline_summary(r.asDict() for r in timeline_frame(classified, enriched).collect())

    g1 = timeline["groups"][D.G1]
    assert [p["minute"][-6:] for p in g1] == ["11:30Z", "11:31Z", "11:32Z"]
    assert [p["deliveries"] for p in g1] == [1, 1, 2]
    assert [p["duplicates"]["retry"] for p in g1] == [0, 1, 0]
    assert [p["duplicates"]["producer_double_send"] for p in g1] == [0, 0, 1]
    assert [p["resends"] for p in g1] == [0, 0, 1]
    assert [p["backlog"] for p in g1] == [1, 2, 1], "A and B staged, A delivered; C staged; B delivered"
    assert [p["p95_ms"] for p in g1] == [5000.0, None, 95000.0]
    everything = timeline["all"]
    assert [p["deliveries"] for p in everything] == [2, 1, 2], "all groups: E counts at minute 0"
    assert [p["backlog"] for p in everything] == [1, 2, 1]
    assert [p["deliveries"] for p in timeline["groups"][D.G2]] == [1]
