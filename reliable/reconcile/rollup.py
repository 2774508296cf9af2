"""Latency percentiles from a log-bucket sketch, and the per-group / overall roll-up of the per-queue rows.

Why not ``percentile_approx``: on ``local[2]`` it was the most expensive step of the job (an object
aggregate per queue, group and overall — three grouping sets — for each latency). Instead each latency is
mapped, on the executors, to a logarithmic bucket (a built-in SQL expression), and Spark only *counts* pairs
per (queue, metric, bucket): a plain hash aggregation. Bucket counts merge exactly, so the group and overall
figures are summed here from the queue rows, without a second pass over the data, and every level's
percentile is a true percentile of its own pairs.

**Error bound.** Bucket ``k ≥ 1`` holds the values in ``(MIN_MS·γ^(k−2), MIN_MS·γ^(k−1)]`` with
``γ = (1 + α)/(1 − α)``; the reported value is the bucket's midpoint in relative terms, so a reported
percentile is within ``α`` = :data:`LATENCY_RELATIVE_ERROR` (0.5 %) *of the value* of the true nearest-rank
percentile (the ``⌈p·n⌉``-th smallest sample). Negative latencies (clock skew) are bucketed the same way by
magnitude; ``|x| < MIN_MS`` (below the timestamps' microsecond resolution) counts as exactly 0. ``max`` and
``count`` are exact, and a reported percentile is clamped to the level's exact ``[min, max]``: a bucket's
midpoint can lie just past its largest sample (p99 80.425 ms beside a max of 80.076 ms until 2026-11-29),
which no true percentile can. Clamping only moves it towards the true value. Pure Python: no Spark needed
to test it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]

#: the relative error of a reported percentile (of its value, see the module docstring)
LATENCY_RELATIVE_ERROR = 0.005
GAMMA = (1 + LATENCY_RELATIVE_ERROR) / (1 - LATENCY_RELATIVE_ERROR)
LOG_GAMMA = math.log(GAMMA)
#: magnitudes below this (ms) are 0: timestamps have microsecond resolution
MIN_MS = 0.001
PERCENTILES = (0.5, 0.95, 0.99)
LATENCY_METRICS = ("first_delivery_ms", "confirm_ms")
LEVEL_QUEUE, LEVEL_GROUP, LEVEL_TOTAL = "queue", "group", "total"
#: per-queue columns that sum into the group and overall rows (the rest: max_stub_offset, maxima, minima)
_NOT_SUMMED = ("consumer_group", "topic", "broker_name", "queue_id", "level", "max_stub_offset")


def bucket_value(bucket: int) -> float:
    """The value reported for a bucket: within :data:`LATENCY_RELATIVE_ERROR` of every value in it."""
    if bucket == 0:
        return 0.0
    k = abs(bucket) - 1
    value = MIN_MS * 2 * GAMMA**k / (GAMMA + 1)
    return value if bucket > 0 else -value


def bucket_of(value: float) -> int:
    """The bucket of a value (the same formula as the Spark expression, for tests and the reference)."""
    if abs(value) < MIN_MS:
        return 0
    k = max(0, math.ceil(math.log(abs(value) / MIN_MS) / LOG_GAMMA)) + 1
    return k if value > 0 else -k


def percentile(counts: Mapping[int, int], p: float) -> float | None:
    """The nearest-rank ``p`` percentile of a bucket histogram (``None`` when it is empty)."""
    n = sum(counts.values())
    if n == 0:
        return None
    rank = max(1, math.ceil(p * n))
    seen = 0
    for bucket in sorted(counts):
        seen += counts[bucket]
        if seen >= rank:
            return bucket_value(bucket)
    raise AssertionError("unreachable: rank <= n")  # pragma: no cover


def clamp(value: float | None, low: float | None, high: float | None) -> float | None:
    """``value`` within the exact ``[low, high]`` of its samples (either bound ``None``: not known)."""
    if value is None:
        return None
    if high is not None and value > high:
        value = float(high)
    if low is not None and value < low:
        value = float(low)
    return value


def _merge(target: dict[str, Any], row: Row) -> None:
    for name, value in row.items():
        if name in _NOT_SUMMED or value is None:
            continue
        if name.endswith("_max"):
            old = target.get(name)
            target[name] = value if old is None else max(old, value)
        elif name.endswith("_min"):
            old = target.get(name)
            target[name] = value if old is None else min(old, value)
        else:
            target[name] = int(target.get(name) or 0) + int(value)
    offset = row.get("max_stub_offset")
    if offset is not None:
        old = target.get("max_stub_offset")
        target["max_stub_offset"] = offset if old is None else max(old, offset)


def roll_up(queue_rows: Iterable[Row], sketch: Iterable[Row]) -> list[Row]:
    """Queue rows plus one row per group and one overall (column ``level``), each with its percentiles.

    ``sketch`` rows are ``consumer_group, topic, broker_name, queue_id, metric, bucket, n``.
    """
    levels: dict[tuple[str, ...], dict[str, Any]] = {}
    hists: dict[tuple[tuple[str, ...], str], dict[int, int]] = {}

    def keys(row: Row) -> list[tuple[str, ...]]:
        q = (
            LEVEL_QUEUE,
            str(row["consumer_group"]),
            str(row["topic"]),
            str(row.get("broker_name") or ""),
            str(row["queue_id"]),
        )
        return [q, (LEVEL_GROUP, str(row["consumer_group"])), (LEVEL_TOTAL,)]

    for row in queue_rows:
        for key in keys(row):
            if key not in levels:
                levels[key] = {"level": key[0], "max_stub_offset": None}
                if key[0] == LEVEL_QUEUE:
                    levels[key].update(consumer_group=row["consumer_group"], topic=row["topic"])
                    levels[key]["broker_name"] = row.get("broker_name") or ""
                    levels[key]["queue_id"] = row["queue_id"]
                elif key[0] == LEVEL_GROUP:
                    levels[key]["consumer_group"] = row["consumer_group"]
            _merge(levels[key], row)
    for row in sketch:
        for key in keys(row):
            hist = hists.setdefault((key, str(row["metric"])), {})
            hist[int(row["bucket"])] = hist.get(int(row["bucket"]), 0) + int(row["n"])
    for key, out in levels.items():
        for metric in LATENCY_METRICS:
            counts = hists.get((key, metric), {})
            for p in PERCENTILES:
                value = percentile(counts, p)
                out[f"{metric}_p{round(p * 100)}"] = clamp(
                    value, out.get(f"{metric}_min"), out.get(f"{metric}_max")
                )
    return list(levels.values())


def never_consumed(queue_rows: Sequence[Row]) -> list[Row]:
    """Queues with pairs and no position of the group (all of a queue's pairs share its watermark)."""
    return [
        {
            "consumer_group": r["consumer_group"],
            "topic": r["topic"],
            "broker_name": r.get("broker_name") or "",
            "queue_id": r["queue_id"],
            "inbox_rows": r["inbox_rows"],
            "pending": r["pending"],
            "max_stub_offset": r["max_stub_offset"],
        }
        for r in queue_rows
        if int(r.get("never_consumed_rows") or 0) > 0
    ]


def targeted_resends(queue_rows: Sequence[Row], cap: int) -> list[Row]:
    """Per group: pairs by targeted resend count (the queues' ``resend_<k>`` columns), zeros left out."""
    out: dict[tuple[str, int], int] = {}
    for r in queue_rows:
        for k in range(cap + 1):
            n = int(r.get(f"resend_{k}") or 0)
            if n:
                key = (str(r["consumer_group"]), k)
                out[key] = out.get(key, 0) + n
    return [{"consumer_group": g, "resend_count": k, "inbox_rows": n} for (g, k), n in sorted(out.items())]
