"""The guard fed what the RocketMQ 5.x adapter builds for a delivery a real broker revived.

A 5.x broker revives a non-FIFO message whose invisible time ran out into the group's pop retry topic
(``%RETRY%{group}_{topic}``, queue 0, a new offset); the receipt handle carries that position. Two things a
group needs from the guard then:

* the delivery is journaled on the retry topic and raises only that topic's watermark: journaled at the
  topic's queue 0 it raised queue 0's watermark to a retry offset — the sweeper re-sent queued messages as
  overtaken, a stall of queue 0 went unseen, the report counted false *lost*;
* a copy labelled for another group that was this group's fatal delivery, revived after a crash that kept its
  dead letter from the broker, is dead-lettered again: the revived copy is never at the position the give-up
  was journaled at, and the exact-position check acknowledged it as ``duplicate_of_dead`` — the dead letter
  was lost.

Every database; the fatal copy also while a dead worker's lease lingers (the guard's peek path).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, idempotent_consumer
from reliable import constants as C
from reliable.adapters.rocketmq5 import to_envelope
from reliable.guard import Reason
from reliable.models import ConsumeProgress, MessageLog
from reliable.stores.lease import lease_key, processing_value
from reliable.types import ConsumeResult, LogOutcome

TOPIC, AUDIT, BILLING, BROKER = "orders", "audit", "billing", "broker-a"
POP_RETRY = f"%RETRY%{AUDIT}_{TOPIC}"
ORIGINAL_OFFSET = 5
#: the broker's pop retry topic has its own offsets, far past anything on the topic's queue 0 here
RETRY_OFFSETS = (9000, 9001, 9002)
MAX_DELIVERIES = 2


def delivery(topic_type: str, offset: int, attempt: int, **props: str) -> Envelope:
    """The adapter's Envelope of message ``m`` as the official client receives it from a real 5.x broker
    (receipt handle in RocketMQ's layout; topic type "1": the group's pop retry topic)."""
    handle = f"12 1700000000000 60000 3 {topic_type} {BROKER} 0 {offset} 884422"
    message = SimpleNamespace(keys={"m"}, message_id="01AB", topic=TOPIC, receipt_handle=handle, body=b"{}",
                              tag=None, delivery_attempt=attempt, properties=props)  # fmt: skip
    return to_envelope(message, MAX_DELIVERIES, group=AUDIT)


def _broken(e: Envelope, session: Session) -> None:
    raise RuntimeError("audit's handler is broken")


def _fine(e: Envelope, session: Session) -> None:
    return None


def _progress(rel: Reliability) -> dict[str, int]:
    with rel.session() as s:
        rows = s.execute(
            select(ConsumeProgress.topic, ConsumeProgress.max_offset).where(
                ConsumeProgress.consumer_group == AUDIT,
                ConsumeProgress.broker_name == BROKER,
                ConsumeProgress.queue_id == 0,
            )
        ).all()
    return {topic: offset for topic, offset in rows}


def test_a_revived_delivery_is_journaled_on_the_pop_retry_topic_and_leaves_the_topics_queue_alone(
    rel: Reliability,
) -> None:
    flaky = idempotent_consumer(rel, group=AUDIT)(_broken)
    assert flaky.decide(delivery("0", ORIGINAL_OFFSET, 1)).result is ConsumeResult.RECONSUME_LATER
    fixed = idempotent_consumer(rel, group=AUDIT)(_fine)
    assert fixed.decide(delivery("1", RETRY_OFFSETS[0], 2)).result is ConsumeResult.SUCCESS
    with rel.session() as s:
        journal = s.execute(
            select(MessageLog.topic, MessageLog.original_topic, MessageLog.queue_id, MessageLog.queue_offset)
            .where(MessageLog.consumer_group == AUDIT, MessageLog.message_id == "m")
            .order_by(MessageLog.id)
        ).all()
    assert [tuple(r) for r in journal] == [
        (TOPIC, TOPIC, 0, ORIGINAL_OFFSET),
        (POP_RETRY, TOPIC, 0, RETRY_OFFSETS[0]),
    ]
    # the group read the topic's queue 0 up to offset 5, no further: messages queued after it are not
    # overtaken, and a stop of the group there stays a stall
    assert _progress(rel) == {TOPIC: ORIGINAL_OFFSET, POP_RETRY: RETRY_OFFSETS[0]}


@pytest.mark.parametrize("lingering_lease", [False, True], ids=["work", "held-lease"])
def test_the_fatal_labelled_copy_revived_after_a_crash_is_dead_lettered_again(
    rel: Reliability, redis_url: str, key_prefix: str, lingering_lease: bool
) -> None:
    """Audit's only copy is the sweeper's resend labelled for billing; audit's handler fails on it until
    audit gives up at its last delivery — itself a revived one. The process dies before the copy reaches the
    DLQ, the broker revives it once more (a new retry offset): audit must dead-letter it again. A later
    resend for billing (a new copy on the topic) is still a settled duplicate."""
    label = {C.ROCKETMQ5_TARGET_GROUP_PROPERTY: BILLING}
    handle = idempotent_consumer(rel, group=AUDIT)(_broken)
    first = handle.decide(delivery("0", ORIGINAL_OFFSET, 1, **label))
    assert first.result is ConsumeResult.RECONSUME_LATER
    fatal = handle.decide(delivery("1", RETRY_OFFSETS[0], 2, **label))
    assert (fatal.reason, fatal.result) == (Reason.MAX_ATTEMPTS, ConsumeResult.DEAD_LETTER)
    client = redis.Redis.from_url(redis_url)
    key = lease_key(key_prefix, AUDIT, "m")
    if lingering_lease:
        client.set(key, processing_value("a-worker-that-died"), px=60_000)
    try:
        again = handle.decide(delivery("1", RETRY_OFFSETS[1], 3, **label))
        assert (again.reason, again.result) == (Reason.GAVE_UP, ConsumeResult.DEAD_LETTER)
        other = handle.decide(delivery("0", ORIGINAL_OFFSET + 1, 1, **label))
        assert (other.reason, other.result) == (Reason.DUPLICATE_OF_DEAD, ConsumeResult.SUCCESS)
    finally:
        client.delete(key)
        client.close()
    with rel.session() as s:
        dead = s.scalars(
            select(MessageLog.queue_offset).where(
                MessageLog.consumer_group == AUDIT, MessageLog.outcome == LogOutcome.DEAD_LETTER
            )
        ).all()
    assert sorted(dead) == [RETRY_OFFSETS[0], RETRY_OFFSETS[1]]
