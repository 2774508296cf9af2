"""The contract tables as the report reads them: projected, typed and windowed (no I/O, no actions).

Columns are selected and cast here, once, whatever the source (JDBC or Parquet), so the transforms can rely on
the types; ``content`` and the other columns the report never reads are dropped at the first step.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from reliable.reconcile.config import CLOCK_SKEW_S, ReconcileConfig
from reliable.types import LogOutcome

STUB_COLUMNS = (
    "message_id",
    "topic",
    "status",
    "send_count",
    "queue_id",
    "queue_offset",
    "created_at",
    "last_sent_at",
    "broker_name",
)
INBOX_COLUMNS = (
    "consumer_group",
    "message_id",
    "status",
    "attempts",
    "resend_count",
    "queue_id",
    "queue_offset",
    "confirmed_at",
    "broker_name",
    "resend_topic",
)
LOG_COLUMNS = (
    "id",
    "message_id",
    "consumer_group",
    "topic",
    "original_topic",
    "queue_id",
    "queue_offset",
    "reconsume_times",
    "received_at",
    "broker_name",
)
#: what is read from ``message_log``: the delivery's columns and its ``outcome``, which the report keeps
#: only as ``retry_level`` (the ``reconsume_times`` of a delivery answered with a retry: the broker's retry
#: schedule applies to it)
LOG_SOURCE_COLUMNS = (*LOG_COLUMNS, "outcome")
PROGRESS_COLUMNS = ("consumer_group", "topic", "queue_id", "max_offset", "broker_name")


def ts(value: dt.datetime) -> Column:
    """A timestamp literal for an aware datetime; the explicit ``Z`` makes it independent of any time zone."""
    return F.lit(value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")).cast("timestamp")


def _broker(df: DataFrame) -> Column:
    """``broker_name`` (migration 0006: a queue is (topic, broker group, queue id)); ``''`` where the data
    has none (exports made before 0006)."""
    if "broker_name" not in df.columns:
        return F.lit("").alias("broker_name")
    return F.coalesce(F.col("broker_name").cast("string"), F.lit("")).alias("broker_name")


def normalize_stubs(stubs: DataFrame) -> DataFrame:
    """Project and type the stub columns the report uses (drops ``content`` and friends early)."""
    return stubs.select(
        F.col("message_id").cast("string"),
        F.col("topic").cast("string"),
        F.upper(F.col("status").cast("string")).alias("status"),
        F.coalesce(F.col("send_count").cast("int"), F.lit(0)).alias("send_count"),
        F.col("queue_id").cast("int"),
        F.col("queue_offset").cast("long"),
        F.col("created_at").cast("timestamp"),
        F.col("last_sent_at").cast("timestamp"),
        _broker(stubs),
    )


def normalize_inbox(inbox: DataFrame) -> DataFrame:
    return inbox.select(
        F.col("consumer_group").cast("string"),
        F.col("message_id").cast("string"),
        F.upper(F.col("status").cast("string")).alias("status"),
        F.coalesce(F.col("attempts").cast("int"), F.lit(0)).alias("attempts"),
        F.coalesce(F.col("resend_count").cast("int"), F.lit(0)).alias("resend_count"),
        F.col("queue_id").cast("int"),
        F.col("queue_offset").cast("long"),
        F.col("confirmed_at").cast("timestamp"),
        _broker(inbox),
        _resend_topic(inbox),
    )


def _resend_topic(inbox: DataFrame) -> Column:
    """Where the group's last targeted resend landed (migration 0011); null where not recorded — an export
    made before the column existed has none at all: its resends are read as before (``%RETRY%{group}``)."""
    if "resend_topic" not in inbox.columns:
        return F.lit(None).cast("string").alias("resend_topic")
    return F.col("resend_topic").cast("string").alias("resend_topic")


def _retry_level(logs: DataFrame, reconsume_times: Column) -> Column:
    """``reconsume_times`` where the delivery was answered with a retry (``outcome`` ``RETRY``), else null.

    An int, not the outcome string, goes through the shuffle: the log is the biggest input. Null where the
    outcome is unknown too — an export made before the report read it has no ``outcome`` column — so such
    deliveries are judged as before (stuck from ``stuck_after`` on, without the broker's retry schedule).
    """
    if "outcome" not in logs.columns:
        return F.lit(None).cast("int").alias("retry_level")
    retry = F.upper(F.col("outcome").cast("string")) == LogOutcome.RETRY.value
    return F.when(retry, reconsume_times).alias("retry_level")


def normalize_logs(logs: DataFrame) -> DataFrame:
    reconsume_times = F.coalesce(F.col("reconsume_times").cast("int"), F.lit(0))
    return logs.select(
        F.col("id").cast("long"),
        F.col("message_id").cast("string"),
        F.col("consumer_group").cast("string"),
        F.col("topic").cast("string"),
        # rows journaled before migration 0003 have no original topic: they were journaled under it
        F.coalesce(F.col("original_topic").cast("string"), F.col("topic").cast("string")).alias(
            "original_topic"
        ),
        F.col("queue_id").cast("int"),
        F.col("queue_offset").cast("long"),
        reconsume_times.alias("reconsume_times"),
        F.col("received_at").cast("timestamp"),
        _broker(logs),
        _retry_level(logs, reconsume_times),
    )


def normalize_progress(progress: DataFrame) -> DataFrame:
    return progress.select(
        F.col("consumer_group").cast("string"),
        F.col("topic").cast("string"),
        F.col("queue_id").cast("int"),
        F.col("max_offset").cast("long"),
        _broker(progress),
    )


def window_stubs(stubs: DataFrame, cfg: ReconcileConfig) -> DataFrame:
    """The messages the report is about: stubs created in ``[since, until)``."""
    cond = F.lit(True)
    if cfg.since is not None:
        cond = cond & (F.col("created_at") >= ts(cfg.since))
    if cfg.until is not None:
        cond = cond & (F.col("created_at") < ts(cfg.until))
    return stubs.where(cond) if cfg.windowed else stubs


def window_logs_for_messages(logs: DataFrame, cfg: ReconcileConfig) -> DataFrame:
    """Deliveries that may belong to a windowed message: from ``since`` minus the clock skew, no upper end.

    No upper end on purpose: a message created just before ``until`` and delivered again just after it must
    show both deliveries, or the window would hide a duplicate (or call a delivered message lost).
    """
    if cfg.since is None:
        return logs
    return logs.where(F.col("received_at") >= ts(cfg.since - dt.timedelta(seconds=CLOCK_SKEW_S)))


def in_log_window(cfg: ReconcileConfig) -> Column:
    """True for deliveries received inside ``[since, until)`` (orphans and gaps look only at those)."""
    cond = F.lit(True)
    if cfg.since is not None:
        cond = cond & (F.col("received_at") >= ts(cfg.since))
    if cfg.until is not None:
        cond = cond & (F.col("received_at") < ts(cfg.until))
    return cond


def in_minute_window(cfg: ReconcileConfig) -> Column:
    """True for per-minute rows (``minute``: the minute's start) of the window's minutes: from the minute
    ``since`` falls in up to the last one that starts before ``until`` (the timeline's pair counts)."""
    cond = F.lit(True)
    if cfg.since is not None:
        first = cfg.since.astimezone(dt.UTC).replace(second=0, microsecond=0)
        cond = cond & (F.col("minute") >= ts(first))
    if cfg.until is not None:
        cond = cond & (F.col("minute") < ts(cfg.until))
    return cond
