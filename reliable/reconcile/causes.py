"""Naming the cause of a new copy: a targeted resend or a producer double-send, judged with the pair's sends.

Why its own step: the delivery window (:func:`reliable.reconcile.transforms.classify_deliveries`) sees only
the log, which tells a retry (``reconsume_times``) and a redelivery (a position seen before) apart, but not
who stored a *new* copy. Only ``%RETRY%{group}`` says "targeted resend" by itself; a RabbitMQ resend goes to
the group's queue and a Kafka or RocketMQ 5.x resend to the shared topic, both on the message's own topic at
a new position — which the job called a producer double-send until 2026-11-29. Who stored the copy is told
by the sends the tables record, which meet the deliveries in the pairs ⋈ deliveries join the job does anyway:
so the new copies are named there, with higher-order functions over the pair's deliveries (no Python UDF, no
further pass over the log).

What the tables record: the stub, the producer's *last* topic-wide send (and ``send_count``); each inbox
row, the position of its group's *last* targeted send (and ``resend_count``). So:

* a copy in ``%RETRY%{group}``, or at a position some group's inbox row records, on the topic it records
  (``resend_topic``, migration 0011; a row recorded before: the message's topic), *is* a targeted resend
  (provable: the copy at a shared-topic resend's position reaches every group); a copy on the message's topic
  at the numbers of a ``%RETRY%`` resend's position is not one (until 2026-11-29 it was taken for one);
* a copy after such a targeted copy is the resend's duplicate too (the original, late rather than lost,
  overtaken by its resend);
* any other new copy is at a position no row records: an earlier send whose position was overwritten. It is
  named ``targeted_resend`` when only resends can have made it — some group of the message had a targeted
  send whose copy is not recorded (``resend_count >= 2``, or a resend with no position: it failed, and a
  failed send may have landed) while the producer sent once — and ``producer_double_send`` otherwise (a
  second topic-wide send, or the producer client's own retry after a lost ACK). Likely, not proven.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from reliable.reconcile.config import RETRY_TOPIC_PREFIX, DuplicateCause

#: the per-message record of targeted sends the pairs carry (:func:`message_resends`)
RESEND_COLUMNS = ("resend_positions", "unrecorded_resends")


def _position(topic: Column, broker: Column, queue_id: Column, offset: Column) -> Column:
    return F.struct(
        F.coalesce(topic, F.lit("")).alias("topic"),
        F.coalesce(broker, F.lit("")).alias("broker_name"),
        queue_id.cast("long").alias("queue_id"),
        offset.cast("long").alias("queue_offset"),
    )


def message_resends(inbox: DataFrame) -> DataFrame:
    """Per message with targeted sends: the positions its groups' rows record, and whether any of its
    groups had a targeted send whose copy no row records.

    A hash aggregation of the rows with ``resend_count > 0`` only; the inbox is partitioned on the message id
    already (:func:`reliable.reconcile.io.by_message`), so it needs no exchange.
    """
    resent = inbox.where(F.col("resend_count") > 0)
    recorded = F.col("queue_offset").isNotNull()
    unrecorded = (F.col("resend_count") >= 2) | ~recorded
    return resent.groupBy("message_id").agg(
        F.collect_list(
            F.when(
                recorded,
                _position(
                    F.col("resend_topic"), F.col("broker_name"), F.col("queue_id"), F.col("queue_offset")
                ),
            )
        ).alias("resend_positions"),
        F.max(unrecorded).alias("unrecorded_resends"),
    )


def _targeted_copy(copy: Column) -> Column:
    """Whether ``copy`` (a delivery of the pair, not a broker retry) is a targeted resend's copy."""
    own_retry_topic = copy["topic"] == F.concat(F.lit(RETRY_TOPIC_PREFIX), F.col("consumer_group"))
    positions = F.coalesce(F.col("resend_positions"), F.array())

    def at(topic: Column) -> Column:
        return _position(topic, copy["broker_name"], copy["queue_id"], copy["queue_offset"])

    # on the topic a row records (migration 0011); a row without one (``''``): on the message's topic
    recorded = F.array_contains(positions, at(copy["topic"])) | (
        (copy["topic"] == F.col("topic")) & F.array_contains(positions, at(F.lit("")))
    )
    return F.coalesce((copy["reconsume_times"] == 0) & (own_retry_topic | recorded), F.lit(False))


def name_new_copies(joined: DataFrame) -> DataFrame:
    """Replace ``deliveries_all`` (every delivery of a pair delivered more than once, in order, with the
    window's ``cause``: retry, redelivery or null for a new copy) by ``extras``: the deliveries after the
    first, each new copy's cause named (module doc). Rows without a pair keep no extras."""
    only_resends = F.coalesce(F.col("unrecorded_resends"), F.lit(False)) & (
        F.coalesce(F.col("send_count"), F.lit(1)) <= 1
    )

    def named(copy: Column, at: Column) -> Column:
        earlier = F.slice(F.col("deliveries_all"), F.lit(1), at)  # ``at``: 0-based, so the ones before it
        cause = (
            F.when(copy["delivery_no"] == 1, F.lit(None).cast("string"))
            .when(copy["cause"].isNotNull(), copy["cause"])
            .when(_targeted_copy(copy), F.lit(DuplicateCause.TARGETED_RESEND.value))
            .when(F.exists(earlier, _targeted_copy), F.lit(DuplicateCause.TARGETED_RESEND.value))
            .when(only_resends, F.lit(DuplicateCause.TARGETED_RESEND.value))
            .otherwise(F.lit(DuplicateCause.PRODUCER_DOUBLE_SEND.value))
        )
        return copy.withField("cause", cause)

    extras = F.filter(F.transform(F.col("deliveries_all"), named), lambda c: c["delivery_no"] > 1)
    return joined.withColumn("extras", F.when(F.col("has_pair"), extras)).drop(
        "deliveries_all", *RESEND_COLUMNS
    )
