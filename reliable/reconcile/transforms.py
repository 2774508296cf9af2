"""The reconciliation as pure DataFrame → DataFrame functions (no I/O, no actions).

Every anomaly the report names is defined here, once, as a column expression; ``docs/reconcile.md`` repeats
the definitions in prose and ``bench/reconcile_duckdb.py`` in SQL. Functions take and return Spark
DataFrames and never collect, so the caller decides what is cached, written or brought to the driver.

Shapes (column names are the contract tables' names, DESIGN.md §1):

* ``stubs``    — message_id, topic, consumer_group, status, send_count, queue_id, queue_offset, created_at,
  last_sent_at, confirmed_at
* ``logs``     — id, message_id, consumer_group, topic, queue_id, queue_offset, reconsume_times, received_at
* ``progress`` — consumer_group, topic, queue_id, max_offset

A *queue* is ``(consumer_group, topic, queue_id)``: the consumer watermark exists per group, so lag and
"below the watermark" only make sense per group. A stub whose send never returned a result has a null
``queue_id``; it is counted under its group and topic with queue_id null.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from reliable.reconcile.config import CLOCK_SKEW_S, DuplicateCause, ReconcileConfig

QUEUE_KEY = ["consumer_group", "topic", "queue_id"]
MESSAGE_KEY = ["message_id", "consumer_group"]
STATUSES = ("PENDING", "CONFIRMED", "VOIDED", "DEAD")

STUB_COLUMNS = (
    "message_id",
    "topic",
    "consumer_group",
    "status",
    "send_count",
    "queue_id",
    "queue_offset",
    "created_at",
    "last_sent_at",
    "confirmed_at",
)
LOG_COLUMNS = (
    "id",
    "message_id",
    "consumer_group",
    "topic",
    "queue_id",
    "queue_offset",
    "reconsume_times",
    "received_at",
)
PROGRESS_COLUMNS = ("consumer_group", "topic", "queue_id", "max_offset")

#: upper edges (ms) of the latency histogram buckets; the last bucket is open-ended.
LATENCY_EDGES_MS = (10, 100, 1_000, 10_000, 60_000, 600_000, 3_600_000)
LATENCY_LABELS = ("<10ms", "<100ms", "<1s", "<10s", "<1m", "<10m", "<1h", ">=1h")
#: send_count values above this share the last bucket of the resend histogram.
RESEND_CAP = 10
PERCENTILES = (0.5, 0.95, 0.99)
#: relative accuracy of percentile_approx is 1/accuracy; 10 000 keeps p99 within 0.01 % of the rank.
PERCENTILE_ACCURACY = 10_000


def _ts(value: dt.datetime) -> Column:
    """A timestamp literal for an aware datetime; the explicit ``Z`` makes it independent of any time zone."""
    return F.lit(value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")).cast("timestamp")


def _ms_between(later: Column, earlier: Column) -> Column:
    return (F.unix_micros(later) - F.unix_micros(earlier)) / F.lit(1000.0)


# --- inputs ------------------------------------------------------------------------------------------------


def normalize_stubs(stubs: DataFrame) -> DataFrame:
    """Project and type the stub columns the report uses (drops ``content`` and friends early)."""
    return stubs.select(
        F.col("message_id").cast("string"),
        F.col("topic").cast("string"),
        F.col("consumer_group").cast("string"),
        F.upper(F.col("status").cast("string")).alias("status"),
        F.coalesce(F.col("send_count").cast("int"), F.lit(0)).alias("send_count"),
        F.col("queue_id").cast("int"),
        F.col("queue_offset").cast("long"),
        F.col("created_at").cast("timestamp"),
        F.col("last_sent_at").cast("timestamp"),
        F.col("confirmed_at").cast("timestamp"),
    )


def normalize_logs(logs: DataFrame) -> DataFrame:
    return logs.select(
        F.col("id").cast("long"),
        F.col("message_id").cast("string"),
        F.col("consumer_group").cast("string"),
        F.col("topic").cast("string"),
        F.col("queue_id").cast("int"),
        F.col("queue_offset").cast("long"),
        F.coalesce(F.col("reconsume_times").cast("int"), F.lit(0)).alias("reconsume_times"),
        F.col("received_at").cast("timestamp"),
    )


def normalize_progress(progress: DataFrame) -> DataFrame:
    return progress.select(
        F.col("consumer_group").cast("string"),
        F.col("topic").cast("string"),
        F.col("queue_id").cast("int"),
        F.col("max_offset").cast("long"),
    )


def window_stubs(stubs: DataFrame, cfg: ReconcileConfig) -> DataFrame:
    """The messages the report is about: stubs created in ``[since, until)``."""
    cond = F.lit(True)
    if cfg.since is not None:
        cond = cond & (F.col("created_at") >= _ts(cfg.since))
    if cfg.until is not None:
        cond = cond & (F.col("created_at") < _ts(cfg.until))
    return stubs.where(cond) if cfg.windowed else stubs


def window_logs_for_messages(logs: DataFrame, cfg: ReconcileConfig) -> DataFrame:
    """Deliveries that may belong to a windowed message: from ``since`` minus the clock skew, no upper end.

    No upper end on purpose: a message created just before ``until`` and delivered again just after it must
    show both deliveries, or the window would hide a duplicate (or call a delivered message lost).
    """
    if cfg.since is None:
        return logs
    return logs.where(F.col("received_at") >= _ts(cfg.since - dt.timedelta(seconds=CLOCK_SKEW_S)))


def in_log_window(cfg: ReconcileConfig) -> Column:
    """True for deliveries received inside ``[since, until)`` (orphans and gaps look only at those)."""
    cond = F.lit(True)
    if cfg.since is not None:
        cond = cond & (F.col("received_at") >= _ts(cfg.since))
    if cfg.until is not None:
        cond = cond & (F.col("received_at") < _ts(cfg.until))
    return cond


# --- deliveries --------------------------------------------------------------------------------------------


def classify_deliveries(logs: DataFrame) -> DataFrame:
    """Number every delivery of a message and name the likely cause of each extra one.

    Adds ``delivery_no`` (1 = the first, by received_at then log id), ``deliveries`` (how many the message
    had), ``first_received_at``, ``last_received_at`` and ``cause`` (null for the first delivery):

    * the delivery is the first at its ``(queue_id, queue_offset)`` → ``producer_double_send`` (the id was
      stored at another offset: only a second send does that);
    * else ``reconsume_times > 0`` → ``retry`` (the consumer asked for it again);
    * else → ``redelivery`` (the same offset again with no retry: rebalance or a lost offset commit).
    """
    by_msg = Window.partitionBy(*MESSAGE_KEY).orderBy("received_at", "id")
    whole = by_msg.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    by_offset = Window.partitionBy(*MESSAGE_KEY, "queue_id", "queue_offset").orderBy("received_at", "id")
    numbered = (
        logs.withColumn("delivery_no", F.row_number().over(by_msg))
        .withColumn("deliveries", F.count(F.lit(1)).over(whole))
        .withColumn("first_received_at", F.first("received_at").over(whole))
        .withColumn("last_received_at", F.last("received_at").over(whole))
        .withColumn("offset_delivery_no", F.row_number().over(by_offset))
    )
    cause = (
        F.when(F.col("delivery_no") == 1, F.lit(None).cast("string"))
        .when(F.col("offset_delivery_no") == 1, F.lit(DuplicateCause.PRODUCER_DOUBLE_SEND.value))
        .when(F.col("reconsume_times") > 0, F.lit(DuplicateCause.RETRY.value))
        .otherwise(F.lit(DuplicateCause.REDELIVERY.value))
    )
    return numbered.withColumn("cause", cause).drop("offset_delivery_no")


def delivery_stats(classified: DataFrame) -> DataFrame:
    """One row per (message_id, consumer_group) that was delivered at least once."""
    return classified.where(F.col("delivery_no") == 1).select(
        *MESSAGE_KEY,
        "deliveries",
        "first_received_at",
        "last_received_at",
        F.col("topic").alias("log_topic"),
        F.col("queue_id").alias("log_queue_id"),
    )


def duplicate_deliveries(classified: DataFrame) -> DataFrame:
    """The extra deliveries (every delivery but the first of its message), with their cause."""
    return classified.where(F.col("delivery_no") > 1).select(
        "message_id",
        "consumer_group",
        "topic",
        "queue_id",
        "queue_offset",
        "reconsume_times",
        "received_at",
        F.col("id").alias("log_id"),
        "delivery_no",
        "deliveries",
        "cause",
    )


# --- stubs -------------------------------------------------------------------------------------------------


def join_stubs_deliveries(stubs: DataFrame, stats: DataFrame) -> DataFrame:
    """Full outer join on (message_id, consumer_group); ``has_stub`` tells the two kinds of row apart.

    One join serves both directions: stub rows get their delivery statistics, delivery rows without a stub
    in the window become orphan candidates.
    """
    marked = stubs.withColumn("has_stub", F.lit(True))
    return marked.join(stats, on=MESSAGE_KEY, how="full_outer").withColumn(
        "has_stub", F.coalesce(F.col("has_stub"), F.lit(False))
    )


def enrich_stubs(joined: DataFrame, progress: DataFrame, cfg: ReconcileConfig) -> DataFrame:
    """Stub rows with the watermark of their queue, their flags and latencies.

    * ``is_lost``: PENDING, never delivered to its group, has an offset, the offset is below the group's
      watermark of that queue (the consumer moved past it), and the last send is older than the grace period;
    * ``is_stuck``: PENDING, delivered, and the newest delivery is older than ``stuck_after``;
    * ``is_unsent``: PENDING, never delivered, no offset (the send never returned), older than the grace
      period;
    * ``is_dead``: status DEAD;
    * ``first_delivery_ms``: created_at → first delivery; ``confirm_ms``: created_at → confirmed_at.
    """
    grace_edge = _ts(cfg.as_of - dt.timedelta(seconds=cfg.grace_s))
    stuck_edge = _ts(cfg.as_of - dt.timedelta(seconds=cfg.stuck_after_s))
    wm = progress.select(*QUEUE_KEY, F.col("max_offset").alias("watermark"))
    stubs = joined.where(F.col("has_stub")).join(F.broadcast(wm), on=QUEUE_KEY, how="left")
    pending = F.col("status") == "PENDING"
    delivered = F.coalesce(F.col("deliveries"), F.lit(0)) > 0
    sent_at = F.coalesce(F.col("last_sent_at"), F.col("created_at"))
    confirmed = (F.col("status") == "CONFIRMED") & F.col("confirmed_at").isNotNull()
    return stubs.select(
        *STUB_COLUMNS,
        "watermark",
        F.coalesce(F.col("deliveries"), F.lit(0)).alias("deliveries"),
        "first_received_at",
        "last_received_at",
        F.coalesce(
            pending
            & ~delivered
            & F.col("queue_offset").isNotNull()
            & (F.col("queue_offset") < F.col("watermark"))
            & (sent_at < grace_edge),
            F.lit(False),
        ).alias("is_lost"),
        F.coalesce(pending & delivered & (F.col("last_received_at") < stuck_edge), F.lit(False)).alias(
            "is_stuck"
        ),
        F.coalesce(
            pending & ~delivered & F.col("queue_offset").isNull() & (sent_at < grace_edge), F.lit(False)
        ).alias("is_unsent"),
        (F.col("status") == "DEAD").alias("is_dead"),
        F.when(delivered, _ms_between(F.col("first_received_at"), F.col("created_at"))).alias(
            "first_delivery_ms"
        ),
        F.when(confirmed, _ms_between(F.col("confirmed_at"), F.col("created_at"))).alias("confirm_ms"),
    )


def orphan_candidates(joined: DataFrame) -> DataFrame:
    """(message_id, consumer_group) delivered but without a stub *for that group in the window*."""
    return joined.where(~F.col("has_stub")).select(*MESSAGE_KEY)


def orphan_logs(
    classified: DataFrame, candidates: DataFrame, all_stub_ids: DataFrame, cfg: ReconcileConfig
) -> DataFrame:
    """Deliveries in the window whose message id has no stub at all (any group, any time).

    ``all_stub_ids`` is the unwindowed ``message_id`` column: a delivery of a message created before the
    window is not an orphan, and a second consumer group's delivery of another group's message is not one
    either (the id is known; the stub names the group whose consumption confirms it).
    """
    orphan_ids = candidates.select("message_id").distinct().join(all_stub_ids, "message_id", "left_anti")
    return (
        classified.where(in_log_window(cfg))
        .join(F.broadcast(orphan_ids), "message_id", "left_semi")
        .select(
            "message_id",
            "consumer_group",
            "topic",
            "queue_id",
            "queue_offset",
            "reconsume_times",
            "received_at",
            F.col("id").alias("log_id"),
        )
    )


def offset_gaps(logs: DataFrame, cfg: ReconcileConfig) -> DataFrame:
    """Holes between consecutive distinct offsets each queue's log holds (deliveries inside the window).

    A hole is a range of offsets the consumer group never journaled although it journaled offsets on both
    sides: a delivery that bypassed the guard, a purged log row or a tag-filtered message. Offsets before
    the first or after the last journaled one are not holes (they are lag or history).
    """
    offsets = logs.where(in_log_window(cfg)).select(*QUEUE_KEY, "queue_offset").distinct()
    w = Window.partitionBy(*QUEUE_KEY).orderBy("queue_offset")
    prev = offsets.withColumn("prev_offset", F.lag("queue_offset").over(w))
    return prev.where(F.col("queue_offset") - F.col("prev_offset") > 1).select(
        *QUEUE_KEY,
        (F.col("prev_offset") + 1).alias("gap_start"),
        (F.col("queue_offset") - 1).alias("gap_end"),
        (F.col("queue_offset") - F.col("prev_offset") - 1).alias("missing"),
    )


# --- detail tables -----------------------------------------------------------------------------------------

_DETAIL = (
    "message_id",
    "consumer_group",
    "topic",
    "queue_id",
    "queue_offset",
    "status",
    "send_count",
    "created_at",
    "last_sent_at",
    "watermark",
    "deliveries",
    "last_received_at",
)


def lost_messages(enriched: DataFrame) -> DataFrame:
    return enriched.where(F.col("is_lost")).select(*_DETAIL)


def stuck_messages(enriched: DataFrame) -> DataFrame:
    return enriched.where(F.col("is_stuck")).select(*_DETAIL)


def dead_messages(enriched: DataFrame) -> DataFrame:
    return enriched.where(F.col("is_dead")).select(*_DETAIL)


def unsent_messages(enriched: DataFrame) -> DataFrame:
    return enriched.where(F.col("is_unsent")).select(*_DETAIL)


# --- aggregates (small results the driver collects) --------------------------------------------------------


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


def queue_stub_stats(enriched: DataFrame) -> DataFrame:
    """Per queue and overall (``is_total``): stub counts by status, anomaly counts, max offset, latencies.

    One aggregation over the grouping sets ``(consumer_group, topic, queue_id)`` and ``()``, so the overall
    percentiles are true percentiles and not an average of the per-queue ones.
    """
    aggs = [
        F.count(F.lit(1)).alias("stubs"),
        F.sum("deliveries").cast("long").alias("deliveries"),
        *(_count_if(F.col("status") == s).alias(s.lower()) for s in STATUSES),
        _count_if(F.col("is_lost")).alias("lost"),
        _count_if(F.col("is_stuck")).alias("stuck"),
        _count_if(F.col("is_unsent")).alias("unsent"),
        F.max("queue_offset").alias("max_stub_offset"),
        F.max("watermark").alias("watermark"),
        *_percentiles("first_delivery_ms"),
        *_percentiles("confirm_ms"),
        *_bucket_counts("first_delivery_ms"),
        *_bucket_counts("confirm_ms"),
    ]
    if hasattr(enriched, "groupingSets"):  # PySpark ≥ 4.0: two grouping sets, not rollup's four
        cols = [F.col(c) for c in QUEUE_KEY]
        grouped = enriched.groupingSets([cols, []], *cols)
    else:  # pragma: no cover - PySpark 3.5
        grouped = enriched.rollup(*QUEUE_KEY)
    full = (1 << len(QUEUE_KEY)) - 1
    rolled = grouped.agg(*aggs, F.grouping_id().alias("_gid"))
    return (
        rolled.where(F.col("_gid").isin(0, full)).withColumn("is_total", F.col("_gid") == full).drop("_gid")
    )


def resend_histogram(enriched: DataFrame) -> DataFrame:
    """How many stubs were sent 0, 1, 2 … times (``RESEND_CAP`` and above share one bucket)."""
    bucket = F.least(F.col("send_count"), F.lit(RESEND_CAP)).alias("send_count")
    return enriched.groupBy(bucket).agg(F.count(F.lit(1)).alias("stubs"))


def duplicate_counts(duplicates: DataFrame) -> DataFrame:
    """Extra deliveries and duplicated messages per queue and cause."""
    return duplicates.groupBy(*QUEUE_KEY, "cause").agg(
        F.count(F.lit(1)).alias("deliveries"),
        F.countDistinct("message_id").alias("messages"),
    )


def per_queue_counts(df: DataFrame, name: str, weight: str | None = None) -> DataFrame:
    """Rows (or the sum of ``weight``) per queue, as column ``name``."""
    agg = F.count(F.lit(1)) if weight is None else F.sum(weight)
    return df.groupBy(*QUEUE_KEY).agg(agg.cast("long").alias(name))
