"""The reconciliation as pure DataFrame → DataFrame functions (no I/O, no actions), per consumer group.

Every anomaly the report names is defined here, once, as a column expression (offset gaps in :mod:`.gaps`,
whose sort-free computation needs more room; orphan logs in :mod:`.orphans`, which choose their own join);
``docs/reconcile.md`` repeats the definitions in prose, and ``bench/reconcile_duckdb.py`` writes them again,
independently, in SQL (the benchmark's cross-check). Functions take and return Spark DataFrames and never
collect, so the caller decides what is cached, written or brought to the driver. The aggregations over these
rows are in :mod:`.aggregates`. Only built-in Spark SQL expressions: no Python UDF runs on an executor.

Shapes (column names are the contract tables' names, DESIGN.md §1):

* ``stubs``    — message_id, topic, status, send_count, queue_id, queue_offset, created_at, last_sent_at,
  broker_name (one row per *message*: the producer's record and its topic-wide send history)
* ``inbox``    — consumer_group, message_id, status, attempts, resend_count, queue_id, queue_offset,
  confirmed_at, broker_name, resend_topic (one row per *(group, message)*: that group's state and its own
  targeted resends)
* ``logs``     — id, message_id, consumer_group, topic (the *delivered* topic), original_topic, queue_id,
  queue_offset, reconsume_times, received_at, broker_name, retry_level (``reconsume_times`` where the
  delivery was answered with a retry, :func:`reliable.reconcile.inputs.normalize_logs`)
* ``progress`` — consumer_group, topic, queue_id, max_offset, broker_name

The subject of the report is the *(group, message) pair*: an inbox row joined with its message's stub. A
*queue* is ``(consumer_group, topic, broker_name, queue_id)``: the watermark exists per group, so lag and
"below the watermark" only make sense per group, and on a RocketMQ cluster each broker group's queue 0 has
its own offsets (``broker_name`` ``''``: no broker groups, or written before migration 0006). A pair is
counted under the queue of the message's last topic-wide send; a message whose send never returned a result
has a null ``queue_id``.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from reliable.reconcile.causes import RESEND_COLUMNS, message_resends, name_new_copies
from reliable.reconcile.config import RETRY_TOPIC_PREFIX, DuplicateCause, ReconcileConfig
from reliable.reconcile.inputs import LOG_COLUMNS, ts
from reliable.reconcile.retry import redelivery_due_at

QUEUE_KEY = ["consumer_group", "topic", "broker_name", "queue_id"]
MESSAGE_KEY = ["message_id", "consumer_group"]
STATUSES = ("PENDING", "CONFIRMED", "VOIDED", "DEAD")

#: one pair: what the detail tables and the aggregates read
PAIR_COLUMNS = (
    "consumer_group",
    "message_id",
    "topic",
    "broker_name",
    "queue_id",
    "queue_offset",
    "status",
    "message_status",
    "send_count",
    "resend_count",
    "resend_topic",
    "resend_broker_name",
    "resend_queue_id",
    "resend_queue_offset",
    "created_at",
    "last_sent_at",
    "confirmed_at",
)


def _ms_between(later: Column, earlier: Column) -> Column:
    return (F.unix_micros(later) - F.unix_micros(earlier)) / F.lit(1000.0)


def retry_topic(group: Column) -> Column:
    """The topic a targeted resend for ``group`` is delivered from (RocketMQ / broker_sim)."""
    return F.concat(F.lit(RETRY_TOPIC_PREFIX), group)


# --- the subject: (group, message) pairs -------------------------------------------------------------------


def pairs(stubs: DataFrame, inbox: DataFrame) -> DataFrame:
    """One row per (group, message) of the window: the group's inbox row with its message's stub.

    Inbox rows whose message has no stub (the guard's inbox pattern: nobody staged it) are not pairs; their
    deliveries are reported as orphan logs. Each pair carries its message's targeted sends
    (:func:`reliable.reconcile.causes.message_resends`), which name the causes of its duplicates.
    """
    message = stubs.select(
        "message_id",
        "topic",
        F.col("status").alias("message_status"),
        "send_count",
        "broker_name",
        "queue_id",
        "queue_offset",
        "created_at",
        "last_sent_at",
    ).join(message_resends(inbox), on="message_id", how="left")
    group = inbox.select(
        "consumer_group",
        "message_id",
        "status",
        "resend_count",
        "resend_topic",
        F.col("broker_name").alias("resend_broker_name"),
        F.col("queue_id").alias("resend_queue_id"),
        F.col("queue_offset").alias("resend_queue_offset"),
        "confirmed_at",
    )
    # a hash join (the stubs are the smaller side): no sort of either side on the message id
    joined = group.join(message.hint("shuffle_hash"), on="message_id", how="inner")
    return joined.select(*PAIR_COLUMNS, *RESEND_COLUMNS)


# --- deliveries --------------------------------------------------------------------------------------------


def _by_pair() -> WindowSpec:
    """The deliveries of one (message, group), in order: the only sort the delivery numbering needs."""
    return Window.partitionBy(*MESSAGE_KEY).orderBy("received_at", "id")


def classify_deliveries(logs: DataFrame) -> DataFrame:
    """Number every delivery of a (message, group) and tell retries and redeliveries from new copies.

    Adds ``delivery_no`` (1 = the first, by received_at then log id), ``deliveries`` (how many the pair
    had), ``first_received_at``, ``last_received_at``, ``last_retry_level`` (the newest delivery's
    ``retry_level``: its ``reconsume_times`` if it asked for a retry) and ``cause``. A *position* is the
    delivered ``(topic, broker_name, queue_id, queue_offset)``:

    * ``reconsume_times > 0`` → ``retry`` (the broker re-delivered it because the consumer asked);
    * else a position this pair was delivered from before → ``redelivery`` (the same stored copy again:
      a rebalance or a lost offset commit);
    * else null: the first delivery, or a *new copy*, whose cause (a targeted resend or a producer
      double-send) takes the pair's sends: :func:`reliable.reconcile.causes.name_new_copies` names it.

    One window, so one sort: "delivered from this position before" is a lookup in the positions of the
    pair's earlier deliveries (a running ``collect_list``; a pair has a handful of deliveries), not a second
    window partitioned by position.
    """
    by_pair = _by_pair()
    whole = by_pair.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    earlier = by_pair.rowsBetween(Window.unboundedPreceding, -1)
    position = F.struct("topic", "broker_name", "queue_id", "queue_offset")
    numbered = logs.select(
        "*",
        F.row_number().over(by_pair).alias("delivery_no"),
        F.count(F.lit(1)).over(whole).alias("deliveries"),
        F.first("received_at").over(whole).alias("first_received_at"),
        F.last("received_at").over(whole).alias("last_received_at"),
        F.last("retry_level").over(whole).alias("last_retry_level"),
        F.coalesce(F.array_contains(F.collect_list(position).over(earlier), position), F.lit(False)).alias(
            "position_seen"
        ),
    )
    cause = (
        F.when(F.col("delivery_no") == 1, F.lit(None).cast("string"))
        .when(F.col("reconsume_times") > 0, F.lit(DuplicateCause.RETRY.value))
        .when(F.col("position_seen"), F.lit(DuplicateCause.REDELIVERY.value))
    )
    return numbered.withColumn("cause", cause).drop("position_seen")


def delivery_stats(classified: DataFrame) -> DataFrame:
    """One row per (message_id, consumer_group) that was delivered at least once.

    ``deliveries_all``: every delivery of a pair delivered more than once, in order, as the duplicates detail
    table shows them (null for a pair delivered once); the join turns it into the pair's ``extras``, the
    deliveries after the first with their causes (:func:`join_pairs_deliveries`). Gathered by a second pass
    over the same window — the rows are already in order, so no second sort — which lets the duplicates
    travel with their pair instead of keeping every classified delivery around for them.
    """
    whole = _by_pair().rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    detail: list[Column | str] = [*DELIVERY_DETAIL, F.col("id").alias("log_id"), "delivery_no", "deliveries"]
    detail.append("cause")
    return (
        classified.withColumn("deliveries_all", F.collect_list(F.struct(*detail)).over(whole))
        .where(F.col("delivery_no") == 1)
        .select(
            *MESSAGE_KEY,
            "deliveries",
            "first_received_at",
            "last_received_at",
            "last_retry_level",
            F.when(F.col("deliveries") > 1, F.col("deliveries_all")).alias("deliveries_all"),
        )
    )


#: a delivery as the detail tables show it: the journal's columns but its id (shown as ``log_id``)
DELIVERY_DETAIL = tuple(c for c in LOG_COLUMNS if c != "id")


def duplicate_deliveries(enriched: DataFrame) -> DataFrame:
    """The extra deliveries (every delivery of a pair but the first), with their cause.

    Read from the ``extras`` of :func:`delivery_stats`, kept on the pairs of the window only: the log is
    read from before the window with no upper end, so a message of another day (or one without a stub,
    whose every delivery is an orphan log already) would otherwise count its redeliveries here.
    """
    return enriched.where(F.col("has_pair") & F.col("extras").isNotNull()).select(F.inline("extras"))


# --- findings ----------------------------------------------------------------------------------------------


def join_pairs_deliveries(rows: DataFrame, stats: DataFrame) -> DataFrame:
    """Full outer join on (message_id, consumer_group); ``has_pair`` tells the two kinds of row apart.

    One join serves both directions: pairs get their delivery statistics, deliveries without a pair in the
    window become orphan candidates. A pair's new copies are named here, where its deliveries meet its
    sends (:func:`reliable.reconcile.causes.name_new_copies`).
    """
    marked = rows.withColumn("has_pair", F.lit(True))
    joined = marked.join(stats.hint("shuffle_hash"), on=MESSAGE_KEY, how="full_outer").withColumn(
        "has_pair", F.coalesce(F.col("has_pair"), F.lit(False))
    )
    return name_new_copies(joined)


def enrich_pairs(joined: DataFrame, progress: DataFrame, cfg: ReconcileConfig) -> DataFrame:
    """Every row of the join with the watermarks its pair is judged against, its flags and latencies.

    The *last send* of a pair is the group's targeted resend when it had one that returned a position (on
    the topic its inbox row records, ``resend_topic``; ``%RETRY%{group}`` when it records none: written
    before migration 0011), else the message's last topic-wide send. ``watermark`` is the group's position on
    the message's queue, ``send_watermark`` on the queue of the last send.

    * ``is_lost``: PENDING, never delivered to its group, the last send has an offset at or below the
      group's watermark of that queue (the group moved past it, or received another message at that offset
      because the broker lost this one and reused the offset — the sweeper's *overtaken*), and the last
      topic-wide send is older than the grace period;
    * ``is_stuck``: PENDING, delivered, the newest delivery is older than ``stuck_after`` and, when it was
      answered with a retry, the broker's redelivery of it (its delay in the sweeper's retry schedule,
      :mod:`.retry`) is older than ``stuck_after`` too — the sweeper's own test (``BROKER_RETRY``), so the
      report does not flag a pair the sweeper rightly holds;
    * ``is_unsent``: PENDING, never delivered, no send returned an offset, older than the grace period;
    * ``is_dead``: status DEAD;
    * ``is_never_consumed``: PENDING or DEAD (a confirmed or voided pair owes nothing), the message has a
      queue and the group has no position on it — matched as the sweeper does
      (:mod:`reliable.sweeper.queues`): a named broker group's queue counts as consumed by a ``''`` row of
      its queue id (a client that cannot name the broker group, a row from before migration 0006), and a
      queue without a broker name by a row of any broker group;
    * ``first_delivery_ms``: created_at → first delivery; ``confirm_ms``: created_at → confirmed_at.

    Narrow on purpose, because this is what the job caches: the columns the aggregations read, plus
    ``message_id`` only where something needs it (a flagged pair, an orphan candidate: ``has_pair`` false)
    and the detail tables' columns as one ``detail`` struct only on flagged pairs — null elsewhere, which
    the columnar cache stores as little more than a null bit. The rows with ``has_pair`` false (deliveries
    without a pair) carry no flags and are left out of every pair figure by the caller.
    """
    grace_edge = ts(cfg.as_of - dt.timedelta(seconds=cfg.grace_s))
    stuck_edge = ts(cfg.as_of - dt.timedelta(seconds=cfg.stuck_after_s))
    wm = F.broadcast(progress.select(*QUEUE_KEY, F.col("max_offset").alias("watermark")))
    send_wm = F.broadcast(
        progress.select(
            "consumer_group",
            F.col("topic").alias("send_topic"),
            F.col("broker_name").alias("send_broker_name"),
            F.col("queue_id").alias("send_queue_id"),
            F.col("max_offset").alias("send_watermark"),
        )
    )
    seen = F.broadcast(
        progress.groupBy("consumer_group", "topic", "queue_id").agg(
            F.max(F.when(F.col("broker_name") == "", F.col("max_offset"))).alias("unnamed_watermark"),
            (F.count(F.lit(1)) > 0).alias("queue_seen"),
        )
    )
    targeted = (F.col("resend_count") > 0) & F.col("resend_queue_offset").isNotNull()
    rows = (
        joined.withColumn(
            "send_topic",
            F.when(
                targeted, F.coalesce(F.col("resend_topic"), retry_topic(F.col("consumer_group")))
            ).otherwise(F.col("topic")),
        )
        .withColumn(
            "send_broker_name", F.when(targeted, F.col("resend_broker_name")).otherwise(F.col("broker_name"))
        )
        .withColumn("send_queue_id", F.when(targeted, F.col("resend_queue_id")).otherwise(F.col("queue_id")))
        .withColumn(
            "send_offset", F.when(targeted, F.col("resend_queue_offset")).otherwise(F.col("queue_offset"))
        )
        .join(wm, on=QUEUE_KEY, how="left")
        .join(send_wm, on=["consumer_group", "send_topic", "send_broker_name", "send_queue_id"], how="left")
        .join(seen, on=["consumer_group", "topic", "queue_id"], how="left")
    )
    pair = F.col("has_pair")
    pending = pair & (F.col("status") == "PENDING")
    delivered = F.coalesce(F.col("deliveries"), F.lit(0)) > 0
    sent_at = F.coalesce(F.col("last_sent_at"), F.col("created_at"))
    confirmed = (F.col("status") == "CONFIRMED") & F.col("confirmed_at").isNotNull()
    due = redelivery_due_at(F.col("last_received_at"), F.col("last_retry_level"))
    consumed = F.coalesce(
        F.col("watermark").isNotNull()
        | ((F.col("broker_name") != "") & F.col("unnamed_watermark").isNotNull())
        | ((F.col("broker_name") == "") & F.col("queue_seen")),
        F.lit(False),
    )
    flagged_rows = rows.select(
        *PAIR_COLUMNS,
        "has_pair",
        "extras",
        "watermark",
        "send_topic",
        "send_broker_name",
        "send_queue_id",
        "send_offset",
        "send_watermark",
        F.coalesce(F.col("deliveries"), F.lit(0)).alias("deliveries"),
        "first_received_at",
        "last_received_at",
        F.coalesce(
            pending
            & ~delivered
            & F.col("send_offset").isNotNull()
            & (F.col("send_offset") <= F.col("send_watermark"))
            & (sent_at < grace_edge),
            F.lit(False),
        ).alias("is_lost"),
        F.coalesce(
            pending
            & delivered
            & (F.col("last_received_at") < stuck_edge)
            & (due.isNull() | (due <= stuck_edge)),
            F.lit(False),
        ).alias("is_stuck"),
        F.coalesce(
            pending & ~delivered & F.col("send_offset").isNull() & (sent_at < grace_edge), F.lit(False)
        ).alias("is_unsent"),
        F.coalesce(pair & (F.col("status") == "DEAD"), F.lit(False)).alias("is_dead"),
        F.coalesce(
            pair & F.col("status").isin("PENDING", "DEAD") & F.col("queue_id").isNotNull() & ~consumed,
            F.lit(False),
        ).alias("is_never_consumed"),
        F.when(pair & delivered, _ms_between(F.col("first_received_at"), F.col("created_at"))).alias(
            "first_delivery_ms"
        ),
        F.when(pair & confirmed, _ms_between(F.col("confirmed_at"), F.col("created_at"))).alias("confirm_ms"),
    )
    any_flag = F.col("is_lost") | F.col("is_stuck") | F.col("is_dead") | F.col("is_unsent")
    return flagged_rows.select(
        *QUEUE_KEY,
        "has_pair",
        "status",
        "queue_offset",
        "send_count",
        "resend_count",
        "deliveries",
        "created_at",
        "last_sent_at",
        "first_received_at",
        *(f"is_{f}" for f in _FLAGS),
        "is_never_consumed",
        "first_delivery_ms",
        "confirm_ms",
        F.when(any_flag | ~pair, F.col("message_id")).alias("message_id"),
        F.when(any_flag, F.struct(*_DETAIL)).alias("detail"),
        "extras",
    )


# --- detail tables -----------------------------------------------------------------------------------------

_DETAIL = (
    "consumer_group",
    "message_id",
    "topic",
    "broker_name",
    "queue_id",
    "queue_offset",
    "status",
    "send_count",
    "resend_count",
    "send_topic",
    "send_broker_name",
    "send_queue_id",
    "send_offset",
    "created_at",
    "last_sent_at",
    "watermark",
    "send_watermark",
    "deliveries",
    "last_received_at",
)


_FLAGS = ("lost", "stuck", "dead", "unsent")


def needs_attention(enriched: DataFrame) -> DataFrame:
    """The pairs with any finding (lost, stuck, dead, unsent): the few rows the detail tables are cut from."""
    any_flag = F.col("is_lost") | F.col("is_stuck") | F.col("is_dead") | F.col("is_unsent")
    return enriched.where(any_flag).select("detail.*", *(f"is_{f}" for f in _FLAGS))


def flagged(enriched: DataFrame, flag: str) -> DataFrame:
    """The detail table of one finding: the pairs with ``is_<flag>`` set."""
    return enriched.where(F.col(f"is_{flag}")).select(*_DETAIL)
