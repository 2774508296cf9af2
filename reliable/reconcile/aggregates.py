"""The small aggregated results the driver collects: per queue, per group and overall.

Each function turns the rows of :mod:`.transforms` into at most a few rows per queue or group, so
``collect()`` stays cheap whatever the table sizes. Built-in Spark SQL only (no Python UDF).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from reliable.reconcile.transforms import QUEUE_KEY, STATUSES

#: upper edges (ms) of the latency histogram buckets; the last bucket is open-ended.
LATENCY_EDGES_MS = (10, 100, 1_000, 10_000, 60_000, 600_000, 3_600_000)
LATENCY_LABELS = ("<10ms", "<100ms", "<1s", "<10s", "<1m", "<10m", "<1h", ">=1h")
#: send counts above this share the last bucket of the resend histograms.
RESEND_CAP = 10
PERCENTILES = (0.5, 0.95, 0.99)
#: relative accuracy of percentile_approx is 1/accuracy; 10 000 keeps p99 within 0.01 % of the rank.
PERCENTILE_ACCURACY = 10_000

#: the grouping levels of :func:`pair_stats`, in the ``level`` column
LEVEL_QUEUE, LEVEL_GROUP, LEVEL_TOTAL = "queue", "group", "total"


def _count_if(cond: Column) -> Column:
    return F.sum(F.when(cond, 1).otherwise(0)).cast("long")


def _bucket_counts(col: str) -> list[Column]:
    out: list[Column] = []
    lower: float | None = None
    for edge, label in zip((*LATENCY_EDGES_MS, None), LATENCY_LABELS, strict=True):
        cond = F.col(col).isNotNull()
        if lower is not None:
            cond = cond & (F.col(col) >= lower)
        if edge is not None:
            cond = cond & (F.col(col) < edge)
        out.append(_count_if(cond).alias(f"{col}_hist_{label}"))
        lower = edge
    return out


def _percentiles(col: str) -> list[Column]:
    pct = F.percentile_approx(col, list(PERCENTILES), PERCENTILE_ACCURACY)
    return [
        *(pct[i].alias(f"{col}_p{round(p * 100)}") for i, p in enumerate(PERCENTILES)),
        F.max(col).alias(f"{col}_max"),
        F.count(col).alias(f"{col}_count"),
    ]


def pair_stats(enriched: DataFrame) -> DataFrame:
    """Per queue, per group and overall (column ``level``): pair counts by status, anomaly counts, max
    offset, latencies.

    One aggregation over the grouping sets *queue*, *group* and *all*, so a group's and the overall
    percentiles are true percentiles and not an average of the per-queue ones.
    """
    aggs = [
        F.count(F.lit(1)).alias("inbox_rows"),
        F.sum("deliveries").cast("long").alias("deliveries"),
        *(_count_if(F.col("status") == s).alias(s.lower()) for s in STATUSES),
        _count_if(F.col("is_lost")).alias("lost"),
        _count_if(F.col("is_stuck")).alias("stuck"),
        _count_if(F.col("is_unsent")).alias("unsent"),
        F.max("queue_offset").alias("max_stub_offset"),
        *_percentiles("first_delivery_ms"),
        *_percentiles("confirm_ms"),
        *_bucket_counts("first_delivery_ms"),
        *_bucket_counts("confirm_ms"),
    ]
    cols = [F.col(c) for c in QUEUE_KEY]
    full = (1 << len(QUEUE_KEY)) - 1
    group_only = full - 4  # consumer_group is the first (most significant) grouping column
    if hasattr(enriched, "groupingSets"):  # PySpark ≥ 4.0: exactly the three sets
        grouped = enriched.groupingSets([cols, [F.col("consumer_group")], []], *cols)
    else:  # pragma: no cover - PySpark 3.5: rollup's four sets, the (group, topic) one dropped below
        grouped = enriched.rollup(*QUEUE_KEY)
    rolled = grouped.agg(*aggs, F.grouping_id().alias("_gid"))
    level = (
        F.when(F.col("_gid") == 0, F.lit(LEVEL_QUEUE))
        .when(F.col("_gid") == group_only, F.lit(LEVEL_GROUP))
        .otherwise(F.lit(LEVEL_TOTAL))
    )
    return rolled.where(F.col("_gid").isin(0, group_only, full)).withColumn("level", level).drop("_gid")


def message_resend_histogram(stubs: DataFrame) -> DataFrame:
    """How many messages were sent to their topic 0, 1, 2 … times (``RESEND_CAP`` and above: one bucket)."""
    bucket = F.least(F.col("send_count"), F.lit(RESEND_CAP)).alias("send_count")
    return stubs.groupBy(bucket).agg(F.count(F.lit(1)).alias("messages"))


def targeted_resend_histogram(enriched: DataFrame) -> DataFrame:
    """Per group: how many of its pairs had 0, 1, 2 … targeted resends."""
    bucket = F.least(F.col("resend_count"), F.lit(RESEND_CAP)).alias("resend_count")
    return enriched.groupBy("consumer_group", bucket).agg(F.count(F.lit(1)).alias("inbox_rows"))


def never_consumed(enriched: DataFrame) -> DataFrame:
    """Queues a group has pairs on but no position at all: it never consumed them (an alarm, not lag)."""
    return (
        enriched.where(F.col("is_never_consumed"))
        .groupBy(*QUEUE_KEY)
        .agg(
            F.count(F.lit(1)).alias("inbox_rows"),
            _count_if(F.col("status") == "PENDING").alias("pending"),
            F.max("queue_offset").alias("max_stub_offset"),
        )
    )


def duplicate_counts(duplicates: DataFrame) -> DataFrame:
    """Extra deliveries and duplicated pairs per delivered queue and cause."""
    return duplicates.groupBy(*QUEUE_KEY, "cause").agg(
        F.count(F.lit(1)).alias("deliveries"),
        F.countDistinct("message_id").alias("messages"),
    )


def per_queue_counts(df: DataFrame, name: str, weight: str | None = None) -> DataFrame:
    """Rows (or the sum of ``weight``) per queue, as column ``name``."""
    agg = F.count(F.lit(1)) if weight is None else F.sum(weight)
    return df.groupBy(*QUEUE_KEY).agg(agg.cast("long").alias(name))
