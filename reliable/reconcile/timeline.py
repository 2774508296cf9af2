"""The timeline: what happened minute by minute — deliveries, duplicates by cause, resends, latency, backlog.

Why a separate transform: totals hide *when*. A chaos run's broker power cut shows as a burst of producer
double-sends and retries at one minute; a consumer that fell behind shows as a backlog line that climbs while
deliveries stay flat. The totals of the rest of the report cannot show either.

Two halves, so the page can be rebuilt from summary.json without Spark:

* :func:`timeline_frame` (Spark, no actions): one row per ``(consumer_group, minute)`` plus one per minute
  over all groups (``consumer_group`` ``*``, a name RocketMQ's group charset cannot produce). Deliveries
  are bucketed by ``received_at``; duplicates by the
  cause :func:`reliable.reconcile.transforms.classify_deliveries` gave them; *resends* are stubs whose
  newest send (``last_sent_at``) was a resend (``send_count > 1``) — earlier resends of the same stub leave
  no timestamp and are not shown; *staged* by ``created_at``, *first delivered* and the p95 of send → first
  delivery by the first delivery's minute.
* :func:`timeline_summary` (plain Python): the rows as summary.json's ``timeline`` — continuous minutes
  (empty ones filled with zeros), and the *backlog*: messages staged so far minus messages delivered so far,
  the lag a person watches build up. At most :data:`MAX_MINUTES` minutes are kept (the most recent).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from reliable.reconcile.config import DuplicateCause

#: how many minutes summary.json keeps per series (the newest): 12 hours
MAX_MINUTES = 720
CAUSES = tuple(c.value for c in DuplicateCause)
COUNTS = ("deliveries", "resends", "staged", "first_delivered")
ALL_GROUPS = "*"


def timeline_frame(classified: Any, enriched: Any) -> Any:
    """Per-minute counts (see module docstring) from the classified deliveries and the enriched stubs."""
    from pyspark.sql import functions as F

    def both(df: Any) -> Any:  # every row once under its group and once under "all groups"
        return df.unionByName(df.withColumn("consumer_group", F.lit(ALL_GROUPS)))

    def minute(col: str) -> Any:
        return F.date_trunc("minute", F.col(col)).alias("minute")

    def count_if(cond: Any) -> Any:
        return F.sum(F.when(cond, 1).otherwise(0)).cast("long")

    key = ["consumer_group", "minute"]
    deliveries = (
        both(classified.select("consumer_group", "received_at", "cause"))
        .groupBy("consumer_group", minute("received_at"))
        .agg(
            F.count(F.lit(1)).alias("deliveries"),
            *(count_if(F.col("cause") == c).alias(f"dup_{c}") for c in CAUSES),
        )
    )
    stubs = both(
        enriched.select(
            "consumer_group",
            "created_at",
            "first_received_at",
            "first_delivery_ms",
            "send_count",
            "last_sent_at",
        )
    )
    staged = stubs.groupBy("consumer_group", minute("created_at")).agg(F.count(F.lit(1)).alias("staged"))
    first = (
        stubs.where(F.col("first_received_at").isNotNull())
        .groupBy("consumer_group", minute("first_received_at"))
        .agg(
            F.count(F.lit(1)).alias("first_delivered"),
            F.percentile_approx("first_delivery_ms", 0.95, 10_000).alias("p95_ms"),
        )
    )
    resends = (
        stubs.where((F.col("send_count") > 1) & F.col("last_sent_at").isNotNull())
        .groupBy("consumer_group", minute("last_sent_at"))
        .agg(F.count(F.lit(1)).alias("resends"))
    )
    joined = deliveries
    for part in (staged, first, resends):
        joined = joined.join(part, on=key, how="full_outer")
    counts = [c for c in joined.columns if c not in (*key, "p95_ms")]
    return joined.fillna(0, subset=counts)


def _iso(minute: dt.datetime) -> str:
    if minute.tzinfo is None:
        minute = minute.replace(tzinfo=dt.UTC)
    return minute.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%MZ")


def _series(rows: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    by_minute = {r["minute"]: r for r in rows}
    start, end = min(by_minute), max(by_minute)
    out: list[dict[str, Any]] = []
    backlog = 0
    minute = start
    while minute <= end:
        r = by_minute.get(minute, {})
        backlog = max(0, backlog + int(r.get("staged") or 0) - int(r.get("first_delivered") or 0))
        p95 = r.get("p95_ms")
        out.append(
            {
                "minute": _iso(minute),
                "deliveries": int(r.get("deliveries") or 0),
                "duplicates": {c: int(r.get(f"dup_{c}") or 0) for c in CAUSES},
                "resends": int(r.get("resends") or 0),
                "p95_ms": None if p95 is None else round(float(p95), 3),
                "backlog": backlog,
            }
        )
        minute += dt.timedelta(minutes=1)
    return out[-MAX_MINUTES:]


def timeline_summary(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """summary.json's ``timeline``: ``{"all": [...], "groups": {group: [...]}}`` of per-minute points."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("minute") is None:
            continue
        grouped.setdefault(str(row.get("consumer_group")), []).append(row)
    series = {g: _series(rs) for g, rs in grouped.items()}
    return {
        "all": series.pop(ALL_GROUPS, []),
        "groups": dict(sorted(series.items())),
        "max_minutes": MAX_MINUTES,
    }
