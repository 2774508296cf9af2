"""The latency percentiles a user reads are within the stated error of the true ones, at every level.

The report trades exact percentiles (a sort) for a log-bucket sketch; these tests pin the promise made in
docs/reconcile.md: a reported percentile is within ``LATENCY_RELATIVE_ERROR`` of the value of the true
nearest-rank percentile, the group and overall figures are percentiles of their own pairs (not averages of
the queues'), and the Spark bucketing is the same function as the documented one.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reliable.reconcile.rollup import (
    LATENCY_RELATIVE_ERROR,
    LEVEL_GROUP,
    LEVEL_TOTAL,
    bucket_of,
    percentile,
    roll_up,
)

latencies = st.floats(min_value=-3_600_000, max_value=7 * 86_400_000, allow_nan=False).map(
    lambda x: round(x, 3)  # microsecond timestamps: latencies in ms have at most three decimals
)


def _true(values: list[float], p: float) -> float:
    return sorted(values)[max(1, math.ceil(p * len(values))) - 1]


def _sketch(values: list[float]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for v in values:
        counts[bucket_of(v)] = counts.get(bucket_of(v), 0) + 1
    return counts


@given(st.lists(latencies, min_size=1, max_size=200), st.sampled_from((0.5, 0.95, 0.99)))
def test_a_sketched_percentile_is_within_the_stated_relative_error(values: list[float], p: float) -> None:
    got = percentile(_sketch(values), p)
    want = _true(values, p)
    assert got is not None
    # abs=1e-3: |x| below a microsecond is reported as 0
    assert got == pytest.approx(want, rel=LATENCY_RELATIVE_ERROR * (1 + 1e-9), abs=1e-3)


def _levels(values: list[float]) -> list[dict[str, Any]]:
    """roll_up of one queue holding ``values`` (as confirm_ms), with the exact min and max the job keeps."""
    row = {
        "consumer_group": "g", "topic": "t", "queue_id": 0, "inbox_rows": len(values),
        "confirm_ms_count": len(values), "confirm_ms_max": max(values), "confirm_ms_min": min(values),
    }  # fmt: skip
    sketch = [
        {"consumer_group": "g", "topic": "t", "queue_id": 0, "metric": "confirm_ms", "bucket": b, "n": n}
        for b, n in _sketch(values).items()
    ]
    return [dict(r) for r in roll_up([row], sketch)]


def test_no_percentile_is_above_the_max_or_below_the_min() -> None:
    """The long-run hunt's report: p99 80.425 ms beside a max of 80.076 ms (the bucket's midpoint lies past
    the one sample in it). A person reading it sees an impossible figure."""
    for level in _levels([10.0, 50.0, 80.076]):
        assert (level["confirm_ms_p95"], level["confirm_ms_p99"]) == (80.076, 80.076)
        assert level["confirm_ms_max"] == 80.076
    for level in _levels([-80.076, -80.076, 3.0]):  # clock skew: negative latencies, the midpoint below min
        assert level["confirm_ms_p50"] == -80.076


@given(st.lists(latencies, min_size=1, max_size=200))
def test_every_percentile_lies_within_the_samples_and_the_stated_error(values: list[float]) -> None:
    for level in _levels(values):
        for p in (0.5, 0.95, 0.99):
            got = level[f"confirm_ms_p{round(p * 100)}"]
            assert min(values) <= got <= max(values)
            assert got == pytest.approx(_true(values, p), rel=LATENCY_RELATIVE_ERROR * (1 + 1e-9), abs=1e-3)


def test_an_empty_sketch_has_no_percentile() -> None:
    assert percentile({}, 0.5) is None


def test_group_and_overall_percentiles_are_those_of_their_own_pairs() -> None:
    """One busy fast queue and one small slow queue: averaging the queues' medians would be wrong."""
    fast = [10.0] * 90
    slow = [1_000.0] * 10
    rows = [
        {"consumer_group": "g", "topic": "t", "queue_id": 0, "inbox_rows": 90, "confirm_ms_count": 90},
        {"consumer_group": "g", "topic": "t", "queue_id": 1, "inbox_rows": 10, "confirm_ms_count": 10},
    ]
    sketch: list[dict[str, Any]] = [
        {"consumer_group": "g", "topic": "t", "queue_id": q, "metric": "confirm_ms", "bucket": b, "n": n}
        for q, values in ((0, fast), (1, slow))
        for b, n in _sketch(values).items()
    ]
    out = roll_up(rows, sketch)
    group = next(r for r in out if r["level"] == LEVEL_GROUP)
    total = next(r for r in out if r["level"] == LEVEL_TOTAL)
    for level in (group, total):
        assert level["inbox_rows"] == 100
        assert level["confirm_ms_p50"] == pytest.approx(10.0, rel=LATENCY_RELATIVE_ERROR)
        assert level["confirm_ms_p95"] == pytest.approx(1_000.0, rel=LATENCY_RELATIVE_ERROR)
        assert level["first_delivery_ms_p50"] is None


def test_spark_buckets_latencies_exactly_as_documented(spark: Any) -> None:
    from pyspark.sql import functions as F

    from reliable.reconcile.aggregates import sketch_and_timeline_counts, sketch_rows

    values = [None, 0.0, 0.0004, -0.0004, 0.001, 0.0011, 1.0, 49.999, 50.0, 250.0, -12.5, 86_400_000.0]
    rows = [("g", "t", "", 0, v, v, None, None, 1, None, 1) for v in values]
    df = spark.createDataFrame(
        rows,
        "consumer_group string, topic string, broker_name string, queue_id int, first_delivery_ms double, "
        "confirm_ms double, created_at timestamp, first_received_at timestamp, send_count int, "
        "last_sent_at timestamp, deliveries int",
    )
    sketch = sketch_rows(sketch_and_timeline_counts(df))
    got = {(r["bucket"], r["n"]) for r in sketch.where(F.col("metric") == "confirm_ms").collect()}
    want: dict[int, int] = {}
    for v in values:
        if v is not None:
            want[bucket_of(v)] = want.get(bucket_of(v), 0) + 1
    assert got == set(want.items())
