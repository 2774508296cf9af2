"""The latency sketch's log buckets as Spark columns: the twins of :func:`reliable.reconcile.rollup.bucket_of`
and :func:`reliable.reconcile.rollup.bucket_value` (which the driver uses on the collected rows).

Why a module of their own: the per-queue sketch (:mod:`.aggregates`) and the timeline's p95
(:mod:`.timeline`) both count pairs by these buckets, and the timeline is also read without Spark, so it
imports them only where it builds Spark columns. Built-in SQL functions only, no Python UDF.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from reliable.reconcile.rollup import GAMMA, LOG_GAMMA, MIN_MS


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
