"""A FastStream Kafka app behind the guard, end to end on Tansu, PostgreSQL and Redis.

What a user of ``@reliable_subscriber(rel, group=…, kafka=policy)`` needs: every record's effect applied once
although the topic holds a duplicate and a handler fails once; a record that always fails goes through the
retry topic to the DLT, and bad input (a different body under a known id) to the DLT, each with its reason.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from faststream.kafka import KafkaBroker
from sqlalchemy import select

from reliable import Envelope, Reliability
from reliable import constants as C
from reliable.adapters.kafka import RetryPolicy, ensure_topics
from reliable.adapters.kafka.aio import AioKafkaSender
from reliable.demo.tansu import Tansu
from reliable.integrations.faststream import reliable_subscriber
from reliable.integrations.faststream_kafka import kafka_parser
from reliable.models import MessageLog
from reliable.sender import OutgoingMessage
from tests.adapters.kafka.helpers import (
    BAD_RECORDS,
    TIMEOUT_S,
    committed,
    effect_counts,
    effects,
    produce,
    read_all,
)
from tests.adapters.kafka.test_kafka_aio import NOT_IDEMPOTENT

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.redis]


def test_a_faststream_kafka_subscriber_behind_the_guard_applies_each_record_once(
    tansu: Tansu, rel: Reliability, topic: str, group: str
) -> None:
    policy = RetryPolicy(delays_s=(0.3,))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    failed_once: set[str] = set()
    broker = KafkaBroker(tansu.bootstrap, logger=None)

    async def on_order(env: Envelope, session: Any) -> None:
        await session.execute(
            effects.insert().values(message_id=env.message_id, consumer_group=group, position="-")
        )
        if env.message_id == "o-bad" or (env.message_id == "o-flaky" and "o-flaky" not in failed_once):
            failed_once.add(env.message_id or "")
            raise RuntimeError(f"boom {env.message_id}")  # rolled back; the guard answers RECONSUME_LATER

    guarded = reliable_subscriber(rel, group=group, kafka=policy)(on_order)
    broker.subscriber(
        *policy.topics(topic),
        group_id=group,
        auto_offset_reset="earliest",
        session_timeout_ms=4000,
        heartbeat_interval_ms=300,
        fetch_max_wait_ms=50,
    )(guarded)
    counts = guarded.counts  # type: ignore[attr-defined]

    async def scenario() -> None:
        async with AioKafkaSender(tansu.bootstrap, config=NOT_IDEMPOTENT) as sender:
            for mid in ["o-1", "o-2", "o-1", "o-flaky", "o-bad"]:  # o-1 landed twice
                await sender.send(OutgoingMessage(mid, topic, b'{"amount": 1}'))
            await sender.send(OutgoingMessage("o-2", topic, b'{"amount": 999}'))  # a different body, known id
        try:
            async with broker:
                await broker.start()
                deadline = asyncio.get_running_loop().time() + TIMEOUT_S
                while counts["success"] + counts["duplicate"] < 4 or counts["dead_letter"] < 2:
                    assert asyncio.get_running_loop().time() < deadline, f"not settled: {counts}"
                    await asyncio.sleep(0.02)
        finally:
            await rel.aclose()

    asyncio.run(scenario())
    assert counts["duplicate"] == 1 and counts["retry_topic"] == 2  # o-flaky and o-bad, once each
    assert effect_counts(rel.engine, group) == {"o-1": 1, "o-2": 1, "o-flaky": 1}
    dead = read_all(tansu.bootstrap, f"{topic}.dlt", expect=2)
    reasons = {
        dict(m.headers())["message-id"]: dict(m.headers())[C.KAFKA_HEADER_REASON].decode() for m in dead
    }
    assert reasons.keys() == {b"o-2", b"o-bad"}
    assert reasons[b"o-2"].startswith("payload_mismatch")
    # the retry topic's delivery was the last: the guard gave up with it (journaled, the row DEAD)
    assert reasons[b"o-bad"].startswith("max_attempts: attempt 2/") and "boom o-bad" in reasons[b"o-bad"]
    assert "the broker's last delivery" in reasons[b"o-bad"]
    assert committed(tansu.bootstrap, group, topic, 1) == [6]


@pytest.mark.parametrize("bad", ["not-utf8-header", "broken-forwarding-headers"])
def test_an_undecodable_record_is_journaled_before_it_goes_to_the_dlt(
    tansu: Tansu, rel: Reliability, topic: str, group: str, bad: str
) -> None:
    """The consumer loops journal an undecodable record (the report counts it); the FastStream subscriber
    sent it to the DLT and wrote no row — and a header that is not UTF-8 never reached it: FastStream's own
    parser dropped the record, its offset committed (``kafka_parser`` hands it on)."""
    policy = RetryPolicy(delays_s=(0.3,))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    if bad == "not-utf8-header":
        record = BAD_RECORDS[0]
    else:  # forwarding headers no copy of ours has
        broken = [(C.KAFKA_HEADER_ORIGINAL_TOPIC, topic.encode()), (C.KAFKA_HEADER_ATTEMPT, b"x")]
        record = (b"k-broken", b"v1", broken)
    produce(tansu.bootstrap, topic, [record, BAD_RECORDS[2]])
    broker = KafkaBroker(tansu.bootstrap, logger=None)

    async def on_order(env: Envelope, session: Any) -> None:
        await session.execute(
            effects.insert().values(message_id=env.message_id, consumer_group=group, position="-")
        )

    guarded = reliable_subscriber(rel, group=group, kafka=policy)(on_order)
    broker.subscriber(
        *policy.topics(topic),
        group_id=group,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
        parser=kafka_parser,
    )(guarded)
    counts = guarded.counts  # type: ignore[attr-defined]

    async def scenario() -> None:
        try:
            async with broker:
                await broker.start()
                deadline = asyncio.get_running_loop().time() + TIMEOUT_S
                while counts["success"] < 1 or counts["undecodable"] < 1:
                    assert asyncio.get_running_loop().time() < deadline, f"not settled: {counts}"
                    await asyncio.sleep(0.02)
        finally:
            await rel.aclose()

    asyncio.run(scenario())
    [dead] = read_all(tansu.bootstrap, f"{topic}.dlt", expect=1)
    assert dead.value() == b"v1"
    with rel.engine.connect() as conn:
        rows = conn.execute(
            select(
                MessageLog.message_id, MessageLog.queue_offset, MessageLog.outcome, MessageLog.reason
            ).where(MessageLog.consumer_group == group, MessageLog.outcome == "DEAD_LETTER")
        ).all()
    assert [(r.message_id, r.queue_offset) for r in rows] == [(f"undecodable:{topic}-0-0", 0)]
    assert rows[0].reason.startswith("bad_message: undecodable: ")
