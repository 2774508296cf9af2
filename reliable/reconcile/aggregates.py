"""The small aggregated results the driver collects: per queue (the group and overall rows are summed from
them on the driver, :mod:`.rollup`).

Each function turns the rows of :mod:`.transforms` into at most a few rows per queue (the latency sketch: a
few hundred per queue at most), so ``collect()`` stays cheap whatever the table sizes. Plain hash
aggregations of built-in Spark SQL expressions only: no Python UDF, no percentile sketch object, no grouping
sets.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from reliable.reconcile.rollup import GAMMA, LATENCY_METRICS, LOG_GAMMA, MIN_MS
from reliable.reconcile.transforms import QUEUE_KEY, STATUSES

#: upper edges (ms) of the latency histogram buckets; the last bucket is open-ended.
LATENCY_EDGES_MS = (10, 100, 1_000, 10_000, 60_000, 600_000, 3_600_000)
LATENCY_LABELS = ("<10ms", "<100ms", "<1s", "<10s", "<1m", "<10m", "<1h", ">=1h")
#: send counts above this share the last bucket of the resend histograms.
RESEND_CAP = 10


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


def queue_stats(enriched: DataFrame) -> DataFrame:
    """Per queue: pair counts by status, anomaly counts, max offset, latency counts/maxima and histogram
    buckets, the never-consumed flag count and the targeted-resend histogram (``resend_<k>``).

    A plain hash aggregation (no percentile sketch, no grouping sets): the group and overall rows are summed
    from these on the driver (:func:`reliable.reconcile.rollup.roll_up`), the percentiles come from
    :func:`latency_sketch`.
    """
    resend = F.least(F.col("resend_count"), F.lit(RESEND_CAP))
    return enriched.groupBy(*QUEUE_KEY).agg(
        F.count(F.lit(1)).alias("inbox_rows"),
        F.sum("deliveries").cast("long").alias("deliveries"),
        *(_count_if(F.col("status") == s).alias(s.lower()) for s in STATUSES),
        _count_if(F.col("is_lost")).alias("lost"),
        _count_if(F.col("is_stuck")).alias("stuck"),
        _count_if(F.col("is_unsent")).alias("unsent"),
        _count_if(F.col("is_never_consumed")).alias("never_consumed_rows"),
        F.max("queue_offset").alias("max_stub_offset"),
        *(F.max(m).alias(f"{m}_max") for m in LATENCY_METRICS),
        *(F.count(m).alias(f"{m}_count") for m in LATENCY_METRICS),
        *_bucket_counts("first_delivery_ms"),
        *_bucket_counts("confirm_ms"),
        *(_count_if(resend == k).alias(f"resend_{k}") for k in range(RESEND_CAP + 1)),
    )


def log_bucket(col: str) -> Column:
    """The Spark twin of :func:`reliable.reconcile.rollup.bucket_of` (built-in SQL, no Python UDF)."""
    x = F.col(col)
    k = F.greatest(F.ceil(F.log(F.abs(x) / F.lit(MIN_MS)) / F.lit(LOG_GAMMA)), F.lit(0)) + 1
    return (
        F.when(x.isNull(), F.lit(None))
        .when(F.abs(x) < MIN_MS, F.lit(0))
        .when(x > 0, k)
        .otherwise(-k)
        .cast("int")
    )


def bucket_value_column(bucket: Column) -> Column:
    """The Spark twin of :func:`reliable.reconcile.rollup.bucket_value`: the value reported for a bucket."""
    k = F.abs(bucket) - 1
    value = F.lit(MIN_MS * 2 / (GAMMA + 1)) * F.pow(F.lit(GAMMA), k)
    return (
        F.when(bucket.isNull(), F.lit(None))
        .when(bucket == 0, F.lit(0.0))
        .when(bucket > 0, value)
        .otherwise(-value)
    )


def latency_sketch(enriched: DataFrame) -> DataFrame:
    """Pairs per (queue, latency metric, log bucket): the mergeable sketch the percentiles are read from."""
    # the metric is keyed by its index (a byte), not its name: hashing and comparing a string key per row
    # was a visible part of this aggregation over millions of pairs; the names come back on the few
    # aggregated rows
    both = F.array(
        *(
            F.struct(F.lit(i).cast("byte").alias("metric"), log_bucket(m).alias("bucket"))
            for i, m in enumerate(LATENCY_METRICS)
        )
    )
    name = F.element_at(F.array(*(F.lit(m) for m in LATENCY_METRICS)), F.col("metric").cast("int") + 1)
    return (
        enriched.select(*QUEUE_KEY, F.inline(both))
        .where(F.col("bucket").isNotNull())
        .groupBy(*QUEUE_KEY, "metric", "bucket")
        .agg(F.count(F.lit(1)).alias("n"))
        .select(*QUEUE_KEY, name.alias("metric"), "bucket", "n")
    )


def message_resend_histogram(stubs: DataFrame) -> DataFrame:
    """How many messages were sent to their topic 0, 1, 2 … times (``RESEND_CAP`` and above: one bucket)."""
    bucket = F.least(F.col("send_count"), F.lit(RESEND_CAP)).alias("send_count")
    return stubs.groupBy(bucket).agg(F.count(F.lit(1)).alias("messages"))


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
