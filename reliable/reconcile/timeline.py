"""The timeline: what happened minute by minute — deliveries, duplicates by cause, resends, latency, backlog.

Why a separate transform: totals hide *when*. A chaos run's broker power cut shows as a burst of producer
double-sends and retries at one minute; a consumer that fell behind shows as a backlog line that climbs while
deliveries stay flat. The totals of the rest of the report cannot show either.

Two halves, so the page can be rebuilt from summary.json without Spark:

* :func:`timeline_frame` (Spark, no actions): one row per ``(consumer_group, minute)`` (``minute`` in epoch
  seconds, UTC, whatever the driver's time zone) plus one per minute
  over all groups (``consumer_group`` ``*``, a name RocketMQ's group charset cannot produce). Deliveries
  are bucketed by ``received_at``; duplicates by the
  cause :func:`reliable.reconcile.transforms.classify_deliveries` gave them; *resends* are stubs whose
  newest send (``last_sent_at``) was a resend (``send_count > 1``) — earlier resends of the same stub leave
  no timestamp and are not shown; *staged* by ``created_at``, *first delivered* and the p95 of send → first
  delivery by the first delivery's minute. A confirmed pair with no journal row left (the log retention
  purged them) was delivered all the same: it counts as first delivered at its ``confirmed_at``
  (*unlogged*), without a latency — until 2026-11-29 it stayed in the backlog for ever, which then grew by
  every message older than the retention.
* :func:`timeline_summary` (plain Python): the rows as summary.json's ``timeline`` — continuous minutes
  (empty ones filled with zeros), and the *backlog*: messages staged so far minus messages delivered so far,
  the lag a person watches build up. At most :data:`MAX_MINUTES` minutes are kept (the most recent). Its
  ``journal`` says how many confirmed pairs had no journal row left and from which minute on the journal
  shows deliveries, so a window over purged days explains its zero deliveries.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from reliable.reconcile.config import DuplicateCause

#: how many minutes summary.json keeps per series (the newest): 12 hours
MAX_MINUTES = 720
CAUSES = tuple(c.value for c in DuplicateCause)
COUNTS = ("deliveries", "resends", "staged", "first_delivered", "unlogged")
ALL_GROUPS = "*"
#: the timeline's latency figure: the nearest-rank p95 of send → first delivery, per minute
P95 = 0.95
#: what a pair row is counted as, keyed by a byte (a string key per row cost the aggregation visibly)
_STAGED, _FIRST, _RESENDS = 0, 1, 2


def _minute(col: Any) -> Any:
    """``date_trunc("minute")`` in UTC, as integer arithmetic (no calendar lookup per row)."""
    from pyspark.sql import functions as F

    micros = F.unix_micros(F.col(col) if isinstance(col, str) else col)
    return F.timestamp_micros(micros - F.pmod(micros, F.lit(60_000_000)))


def timeline_kinds() -> list[tuple[int, Any, Any]]:
    """What one pair row counts for: ``(kind, minute, latency bucket)`` columns, a null minute counting for
    nothing — staged at ``created_at``, first delivered (with the log bucket of send → first delivery) and
    re-sent at ``last_sent_at``.

    A confirmed pair without a delivery in the journal (purged) is first delivered at its confirmation with
    a null bucket: one kind, so the pairs are not read twice; the null bucket tells them apart (a delivered
    pair always has a latency). ``confirmed_at`` is ``created_at + confirm_ms`` (the cached pairs keep no
    ``confirmed_at`` column of their own)."""
    from pyspark.sql import functions as F

    from reliable.reconcile.buckets import log_bucket

    resent = (F.col("send_count") > 1) & F.col("last_sent_at").isNotNull()
    confirmed_at = F.timestamp_micros(
        F.unix_micros(F.col("created_at")) + F.round(F.col("confirm_ms") * F.lit(1000)).cast("long")
    )
    unlogged = F.when((F.col("deliveries") == 0) & F.col("confirm_ms").isNotNull(), confirmed_at)
    return [
        (_STAGED, _minute("created_at"), F.lit(None).cast("int")),
        (_FIRST, _minute(F.coalesce(F.col("first_received_at"), unlogged)), log_bucket("first_delivery_ms")),
        (_RESENDS, F.when(resent, _minute("last_sent_at")), F.lit(None).cast("int")),
    ]


def timeline_frame(
    deliveries: Any,
    duplicates: Any,
    counted: Any,
    keep: Callable[[Any], Any] = lambda df: df,
) -> Any:
    """Per-minute counts (see module docstring) from the deliveries, the extra deliveries and the pair counts.

    ``deliveries`` has ``consumer_group, received_at`` (every delivery, counted once); ``duplicates`` the
    extra deliveries with their ``cause`` (:func:`reliable.reconcile.transforms.duplicate_deliveries`);
    ``counted`` the pairs counted per (group, kind, minute, latency bucket) — ``consumer_group, kind, minute,
    bucket, n``, from :func:`reliable.reconcile.aggregates.timeline_rows` of
    :func:`reliable.reconcile.aggregates.sketch_and_timeline_counts`, which counts the pairs for the latency
    sketch in the same scan. ``keep`` is applied to the small aggregated frame the rest reads several times
    (the job persists and materialises it, so the scan of the deliveries runs once).

    One scan of the deliveries by minute and cause; the staged, first-delivered and re-sent pairs come
    from ``counted``, the first delivery's minute keyed with its log bucket
    (:func:`reliable.reconcile.buckets.log_bucket`), so the p95 is read from bucket counts (within
    :data:`reliable.reconcile.rollup.LATENCY_RELATIVE_ERROR` of the nearest-rank value) instead of a
    percentile sketch object per minute. Everything after that works on the small aggregated rows: the "all
    groups" rows are their sums, never a second copy of the input.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from reliable.reconcile.buckets import bucket_value_column

    def count_if(cond: Any) -> Any:
        return F.sum(F.when(cond, 1).otherwise(0)).cast("long")

    def with_all(df: Any, keys: list[str], sums: list[str]) -> Any:  # the groups' rows plus their sums as "*"
        total = df.groupBy(*keys).agg(*(F.sum(c).cast("long").alias(c) for c in sums))
        return df.unionByName(total.withColumn("consumer_group", F.lit(ALL_GROUPS)))

    key = ["consumer_group", "minute"]
    # every delivery counted once, each extra one's cause from the duplicates
    arrivals = deliveries.select(
        "consumer_group",
        "received_at",
        F.lit(None).cast("string").alias("cause"),
        F.lit(1).alias("counts"),
    ).unionByName(duplicates.select("consumer_group", "received_at", "cause", F.lit(0).alias("counts")))
    per_minute = arrivals.groupBy("consumer_group", _minute("received_at").alias("minute")).agg(
        F.sum("counts").cast("long").alias("deliveries"),
        *(count_if(F.col("cause") == c).alias(f"dup_{c}") for c in CAUSES),
    )
    per_minute = with_all(keep(per_minute), ["minute"], ["deliveries", *(f"dup_{c}" for c in CAUSES)])
    counted = with_all(counted, ["kind", "minute", "bucket"], ["n"])
    counts = counted.groupBy(*key).agg(
        *(
            F.sum(F.when(F.col("kind") == k, F.col("n")).otherwise(0)).cast("long").alias(name)
            for k, name in ((_STAGED, "staged"), (_FIRST, "first_delivered"), (_RESENDS, "resends"))
        ),
        F.sum(F.when((F.col("kind") == _FIRST) & F.col("bucket").isNull(), F.col("n")).otherwise(0))
        .cast("long")
        .alias("unlogged"),
    )
    firsts = counted.where((F.col("kind") == _FIRST) & F.col("bucket").isNotNull())
    running = Window.partitionBy(*key).orderBy("bucket").rowsBetween(Window.unboundedPreceding, 0)
    p95 = (
        firsts.withColumn("seen", F.sum("n").over(running))
        .withColumn("rank", F.ceil(F.sum("n").over(Window.partitionBy(*key)) * F.lit(P95)))
        .where(F.col("seen") >= F.greatest(F.col("rank"), F.lit(1)))
        .groupBy(*key)
        .agg(F.min("bucket").alias("bucket"))
        .select(*key, bucket_value_column(F.col("bucket")).alias("p95_ms"))
    )
    joined = per_minute.join(counts, on=key, how="full_outer").join(p95, on=key, how="left")
    numbers = [c for c in joined.columns if c not in (*key, "p95_ms")]
    # epoch seconds, not a timestamp: collect() turns a timestamp into a naive datetime in the *Python
    # process's* local time zone (the session's UTC does not apply), which shifted every minute by the
    # driver host's offset (TZ=Asia/Kolkata: +5:30) until 2026-11-28
    return joined.fillna(0, subset=numbers).withColumn("minute", F.unix_seconds(F.col("minute")))


def _instant(minute: int | float | dt.datetime) -> dt.datetime:
    """A row's minute as an aware UTC datetime: epoch seconds (what :func:`timeline_frame` gives) or an aware
    datetime. A naive one is refused: from Spark it would be in the local zone, and guessing shifts it."""
    if isinstance(minute, dt.datetime):
        if minute.tzinfo is None:
            raise ValueError(f"timeline minute {minute.isoformat()} has no time zone (use epoch seconds)")
        return minute.astimezone(dt.UTC)
    return dt.datetime.fromtimestamp(minute, dt.UTC)


def _iso(minute: dt.datetime) -> str:
    return minute.strftime("%Y-%m-%dT%H:%MZ")


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


def _journal(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """What the journal still shows of the timeline (all groups' rows): the first minute with a delivery,
    and how many confirmed pairs have no journal row left (counted as delivered at their confirmation)."""
    delivered = [r["minute"] for r in rows if int(r.get("deliveries") or 0) > 0]
    return {
        "first_delivery": _iso(min(delivered)) if delivered else None,
        "unlogged_confirmed": sum(int(r.get("unlogged") or 0) for r in rows),
    }


def timeline_summary(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """summary.json's ``timeline``: ``{"all": [...], "groups": {group: [...]}, "journal": {...}}`` of
    per-minute points (``journal``: :func:`_journal`)."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("minute") is None:
            continue
        grouped.setdefault(str(row.get("consumer_group")), []).append(
            {**row, "minute": _instant(row["minute"])}
        )
    journal = _journal(grouped.get(ALL_GROUPS, []))
    series = {g: _series(rs) for g, rs in grouped.items()}
    return {
        "all": series.pop(ALL_GROUPS, []),
        "groups": dict(sorted(series.items())),
        "max_minutes": MAX_MINUTES,
        "journal": journal,
    }
