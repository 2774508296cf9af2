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

from reliable.reconcile.buckets import log_bucket
from reliable.reconcile.rollup import LATENCY_METRICS
from reliable.reconcile.timeline import timeline_kinds
from reliable.reconcile.transforms import QUEUE_KEY, STATUSES

#: upper edges (ms) of the latency histogram buckets; the last bucket is open-ended.
LATENCY_EDGES_MS = (10, 100, 1_000, 10_000, 60_000, 600_000, 3_600_000)
LATENCY_LABELS = ("<10ms", "<100ms", "<1s", "<10s", "<1m", "<10m", "<1h", ">=1h")
#: send counts above this share the last bucket of the resend histograms.
RESEND_CAP = 10


def _bucket_index(col: str) -> Column:
    """The index of ``col``'s latency histogram bucket (:data:`LATENCY_LABELS`), null when ``col`` is."""
    x = F.col(col)
    index = F.when(x.isNull(), F.lit(None))
    for i, edge in enumerate(LATENCY_EDGES_MS):
        index = index.when(x < edge, F.lit(i))
    return index.otherwise(F.lit(len(LATENCY_EDGES_MS))).cast("byte")


def _sum_if(cond: Column) -> Column:
    """The pair count of the fine rows (``n``) meeting ``cond``."""
    return F.sum(F.when(cond, F.col("n")).otherwise(0)).cast("long")


def queue_stats(enriched: DataFrame) -> DataFrame:
    """Per queue: pair counts by status, anomaly counts, max offset, latency counts/extremes and histogram
    buckets, the never-consumed flag count and the targeted-resend histogram (``resend_<k>``).

    Two plain hash aggregations (no percentile sketch, no grouping sets): the pairs are first counted per
    queue *and* status, flags, capped resend count and latency histogram buckets — a few aggregate
    functions per row instead of one per output column (about fifty), which was most of this scan's CPU —
    and those few hundred rows per queue are then summed into the queue's columns. The group and overall
    rows are summed from these on the driver (:func:`reliable.reconcile.rollup.roll_up`), the percentiles
    come from :func:`sketch_rows`.
    """
    flags = ("is_lost", "is_stuck", "is_unsent", "is_never_consumed")
    fine = enriched.groupBy(
        *QUEUE_KEY,
        "status",
        *flags,
        F.least(F.col("resend_count"), F.lit(RESEND_CAP)).alias("resend"),
        *(_bucket_index(m).alias(f"{m}_hist") for m in LATENCY_METRICS),
    ).agg(
        F.count(F.lit(1)).alias("n"),
        F.sum("deliveries").alias("deliveries"),
        F.max("queue_offset").alias("max_stub_offset"),
        *(F.max(m).alias(f"{m}_max") for m in LATENCY_METRICS),
        *(F.min(m).alias(f"{m}_min") for m in LATENCY_METRICS),
    )
    return fine.groupBy(*QUEUE_KEY).agg(
        F.sum("n").cast("long").alias("inbox_rows"),
        F.sum("deliveries").cast("long").alias("deliveries"),
        *(_sum_if(F.col("status") == s).alias(s.lower()) for s in STATUSES),
        _sum_if(F.col("is_lost")).alias("lost"),
        _sum_if(F.col("is_stuck")).alias("stuck"),
        _sum_if(F.col("is_unsent")).alias("unsent"),
        _sum_if(F.col("is_never_consumed")).alias("never_consumed_rows"),
        F.max("max_stub_offset").alias("max_stub_offset"),
        *(F.max(f"{m}_max").alias(f"{m}_max") for m in LATENCY_METRICS),
        *(F.min(f"{m}_min").alias(f"{m}_min") for m in LATENCY_METRICS),
        *(_sum_if(F.col(f"{m}_hist").isNotNull()).alias(f"{m}_count") for m in LATENCY_METRICS),
        *(
            _sum_if(F.col(f"{m}_hist") == i).alias(f"{m}_hist_{label}")
            for m in LATENCY_METRICS
            for i, label in enumerate(LATENCY_LABELS)
        ),
        *(_sum_if(F.col("resend") == k).alias(f"resend_{k}") for k in range(RESEND_CAP + 1)),
    )


def _metric_names(index: Column) -> Column:
    return F.element_at(F.array(*(F.lit(m) for m in LATENCY_METRICS)), index.cast("int") + 1)


def sketch_and_timeline_counts(enriched: DataFrame) -> DataFrame:
    """The latency sketch (pairs per queue, latency metric and log bucket: the mergeable sketch the
    percentiles are read from) and the timeline's pair counts in one pass: one row per aggregated key.

    Each pair becomes two sketch rows (``kind`` the metric's index, the queue key, ``minute`` null) and
    the timeline's three (``kind`` ``len(LATENCY_METRICS)`` + the timeline's kind, ``consumer_group``
    only, ``minute`` set); one hash aggregation counts them all, so the cached pairs are scanned once for
    both, and :func:`sketch_rows` / :func:`timeline_rows` split the (small) result.
    """
    queue_id = dict(enriched.dtypes)["queue_id"]
    metrics = [
        F.struct(
            F.lit(i).cast("byte").alias("kind"),
            F.col("topic").alias("topic"),
            F.col("broker_name").alias("broker_name"),
            F.col("queue_id").alias("queue_id"),
            F.lit(None).cast("timestamp").alias("minute"),
            log_bucket(m).alias("bucket"),
        )
        for i, m in enumerate(LATENCY_METRICS)
    ]
    first = len(LATENCY_METRICS)
    timeline = [
        F.struct(
            F.lit(first + kind).cast("byte").alias("kind"),
            F.lit(None).cast("string").alias("topic"),
            F.lit(None).cast("string").alias("broker_name"),
            F.lit(None).cast(queue_id).alias("queue_id"),
            minute.alias("minute"),
            bucket.cast("int").alias("bucket"),
        )
        for kind, minute, bucket in timeline_kinds()
    ]
    wanted = F.when(F.col("kind") < first, F.col("bucket").isNotNull()).otherwise(F.col("minute").isNotNull())
    return (
        enriched.select("consumer_group", F.inline(F.array(*metrics, *timeline)))
        .where(wanted)
        .groupBy(*QUEUE_KEY, "kind", "minute", "bucket")
        .agg(F.count(F.lit(1)).alias("n"))
    )


def sketch_rows(counts: DataFrame) -> DataFrame:
    """The latency sketch rows of :func:`sketch_and_timeline_counts`: ``QUEUE_KEY, metric, bucket, n``, the
    metric by name (it is counted by its index, a byte: hashing a string key per pair was a visible part of
    the aggregation over millions of pairs)."""
    return counts.where(F.col("kind") < len(LATENCY_METRICS)).select(
        *QUEUE_KEY, _metric_names(F.col("kind")).alias("metric"), "bucket", "n"
    )


def timeline_rows(counts: DataFrame) -> DataFrame:
    """The timeline's pair counts of :func:`sketch_and_timeline_counts`: ``consumer_group, kind, minute,
    bucket, n`` (:func:`reliable.reconcile.timeline.timeline_frame`'s ``counted``)."""
    first = len(LATENCY_METRICS)
    return counts.where(F.col("kind") >= first).select(
        "consumer_group", (F.col("kind") - first).cast("byte").alias("kind"), "minute", "bucket", "n"
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
