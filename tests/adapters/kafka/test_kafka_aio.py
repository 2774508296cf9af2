"""The aiokafka flavour against a live Tansu broker, PostgreSQL and Redis: an ``async def`` handler behind the
async guard, records sent with the async Sender.

What an asyncio user needs from it, as from the confluent-kafka loop: each record's effect applied once
although the topic holds duplicates; a failing record hops through the retry topics and lands in the DLT
with its reason; bad input (an undecodable header, no id at all) goes to the DLT, never silently committed.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from sqlalchemy.ext.asyncio import AsyncSession

from broker_sim.common.net import listen_port
from reliable import Envelope, Reliability, idempotent_consumer
from reliable import constants as C
from reliable.adapters.kafka import RetryMode, RetryPolicy, ensure_topics
from reliable.adapters.kafka.aio import AioKafkaGuardedConsumer, AioKafkaSender
from reliable.demo.tansu import Tansu
from reliable.errors import ConfigurationError
from reliable.sender import AsyncSender, OutgoingMessage
from tests.adapters.kafka.helpers import (
    BAD_RECORDS,
    TIMEOUT_S,
    assert_bad_records_dead_lettered,
    assert_bad_records_journaled,
    committed,
    effect_counts,
    effects,
    headers_of,
    produce,
    read_all,
    with_ids,
)

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.redis]

#: aiokafka's names for the demo's FAST_GROUP settings (Tansu answers a join after its own short delay)
AIO_FAST_GROUP = {
    "session_timeout_ms": 4000,
    "heartbeat_interval_ms": 300,
    "metadata_max_age_ms": 1000,
    "fetch_max_wait_ms": 50,
}
#: Tansu 0.6 answers aiokafka's InitProducerId (sent without a producer id) with an error, so the idempotent
#: producer cannot start against it; acks=all stays (docs/adapters.md, Kafka, states the limit)
NOT_IDEMPOTENT = {"enable_idempotence": False}


def effect(group: str) -> Callable[[Envelope, AsyncSession], Awaitable[None]]:
    async def handler(env: Envelope, session: AsyncSession) -> None:
        position = f"{env.delivered_topic or env.topic}-{env.queue_id}@{env.queue_offset}"
        await session.execute(
            effects.insert().values(message_id=env.message_id, consumer_group=group, position=position)
        )

    return handler


def consume(
    tansu: Tansu,
    rel: Reliability,
    topic: str,
    group: str,
    handle: Any,
    done: Callable[[Any], bool],
    **kw: Any,
) -> AioKafkaGuardedConsumer:
    async def scenario() -> AioKafkaGuardedConsumer:
        consumer = AioKafkaGuardedConsumer(
            tansu.bootstrap, topic, group, handle, config=AIO_FAST_GROUP, producer=NOT_IDEMPOTENT, **kw
        )
        try:
            async with consumer:
                assert await consumer.run(until=lambda: done(consumer.counts), timeout_s=TIMEOUT_S), dict(
                    consumer.counts
                )
        finally:
            await rel.aclose()
        return consumer

    return asyncio.run(scenario())


def test_every_record_sent_async_is_applied_once_and_duplicates_are_suppressed(
    tansu: Tansu, rel: Reliability, topic: str, group: str
) -> None:
    policy = RetryPolicy(delays_s=(0.3,))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    ids = [f"m{i}" for i in range(20)]

    async def send_all() -> tuple[list[int], int | None]:
        async with AioKafkaSender(tansu.bootstrap, config=NOT_IDEMPOTENT) as sender:
            assert isinstance(sender, AsyncSender)
            offsets = []
            for mid in [*ids, "m3", "m7"]:  # two producer retries that landed twice
                receipt = await sender.send(OutgoingMessage(mid, topic, f"body-{mid}".encode(), tags="t"))
                offsets.append(receipt.queue_offset)
            return offsets, await sender.max_offset(topic, 0)

    offsets, high = asyncio.run(send_all())
    assert offsets == list(range(22)) and high == 22
    handle = idempotent_consumer(rel, group=group)(effect(group))
    consumer = consume(
        tansu, rel, topic, group, handle, lambda n: n["success"] + n["duplicate"] >= 22, retry=policy
    )
    assert consumer.counts["duplicate"] == 2
    assert effect_counts(rel.engine, group) == {i: 1 for i in ids}
    assert committed(tansu.bootstrap, group, topic, 1) == [22]


def test_failures_hop_through_the_retry_topics_to_the_dlt_with_their_reason(
    tansu: Tansu, rel: Reliability, topic: str, group: str
) -> None:
    policy = RetryPolicy(delays_s=(0.3, 0.6))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    seen: dict[str, list[tuple[str, int]]] = {}
    apply = effect(group)

    async def handler(env: Envelope, session: AsyncSession) -> None:
        seen.setdefault(env.message_id or "", []).append((env.source_topic, env.reconsume_times))
        if env.message_id == "always-fails" or (env.message_id == "fails-once" and env.reconsume_times == 0):
            raise RuntimeError(f"boom {env.message_id}")
        await apply(env, session)

    produce(
        tansu.bootstrap,
        topic,
        [
            (m.encode(), m.encode(), [("message-id", m.encode())])
            for m in ["ok", "fails-once", "always-fails"]
        ],
    )
    handle = idempotent_consumer(rel, group=group)(handler)
    consume(
        tansu,
        rel,
        topic,
        group,
        handle,
        lambda n: n["dead_letter"] >= 1 and n["success"] >= 2,
        retry=policy,
    )
    assert effect_counts(rel.engine, group) == {"ok": 1, "fails-once": 1}
    assert list(dict.fromkeys(seen["always-fails"])) == [
        (topic, 0),
        (f"{topic}.retry.1", 1),
        (f"{topic}.retry.2", 2),
    ]
    (dead,) = read_all(tansu.bootstrap, f"{topic}.dlt", expect=1)
    headers = headers_of(dead)
    assert dead.value() == b"always-fails" and headers["message-id"] == "always-fails"
    assert headers[C.KAFKA_HEADER_REASON].startswith("max_attempts: attempt 3/10, the broker's last delivery")
    assert "boom always-fails" in headers[C.KAFKA_HEADER_REASON]
    assert headers[C.KAFKA_HEADER_ORIGINAL_TOPIC] == topic and headers[C.KAFKA_HEADER_ATTEMPT] == "3"
    first_retry = read_all(tansu.bootstrap, f"{topic}.retry.1", expect=2)
    assert sorted(m.value() for m in first_retry) == [b"always-fails", b"fails-once"]


def test_a_blocking_give_up_is_the_guards_last_attempt_with_its_reason(
    tansu: Tansu, rel: Reliability, topic: str, group: str
) -> None:
    """As the confluent-kafka loop: in blocking mode the head's third failure is the guard's last attempt
    too — the dead-letter copy carries the guard's ``max_attempts`` reason (the row ends DEAD, a person is
    told) instead of the loop's own 'retries exhausted' over a row left PENDING."""
    policy = RetryPolicy(delays_s=(0.2, 0.2), mode=RetryMode.BLOCKING)
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    apply = effect(group)

    async def handler(env: Envelope, session: AsyncSession) -> None:
        if env.message_id == "poison":
            raise RuntimeError("always fails")
        await apply(env, session)

    produce(tansu.bootstrap, topic, with_ids(["poison", "ok"]))
    handle = idempotent_consumer(rel, group=group)(handler)
    consume(
        tansu, rel, topic, group, handle, lambda n: n["dead_letter"] >= 1 and n["success"] >= 1, retry=policy
    )
    (dead,) = read_all(tansu.bootstrap, f"{topic}.dlt", expect=1)
    reason = headers_of(dead)[C.KAFKA_HEADER_REASON]
    assert reason.startswith("max_attempts: attempt 3/10, the broker's last delivery"), reason
    assert effect_counts(rel.engine, group) == {"ok": 1}


def test_bad_records_go_to_the_dlt_with_their_reason(
    tansu: Tansu, rel: Reliability, topic: str, group: str
) -> None:
    policy = RetryPolicy(delays_s=(0.3,))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    produce(tansu.bootstrap, topic, BAD_RECORDS)
    handle = idempotent_consumer(rel, group=group)(effect(group))
    consume(
        tansu,
        rel,
        topic,
        group,
        handle,
        lambda n: n["success"] >= 1 and n["dead_letter"] + n["undecodable"] >= 2,
        retry=policy,
        allow_position_id=False,
    )
    assert_bad_records_dead_lettered(tansu.bootstrap, topic)
    assert_bad_records_journaled(rel.engine, group, topic)
    assert effect_counts(rel.engine, group) == {"fine": 1}
    assert committed(tansu.bootstrap, group, topic, 1) == [3]


def test_a_record_held_across_a_rebalance_is_applied_and_never_committed_past(
    tansu: Tansu, rel: Reliability, topic: str, group: str
) -> None:
    """A member holds a record (blocking retry: its partition paused for 30 s) when another member joins the
    group and stays. aiokafka forgets the pause at the new assignment and fetches from the committed offset:
    a member that still counted the partition as held skipped what it fetched there, and committed past the
    held record with the next record it answered — applied by nobody in this group."""
    policy = RetryPolicy(delays_s=(30.0,), mode=RetryMode.BLOCKING)
    other_topic = f"{topic}-other"
    ensure_topics(tansu.bootstrap, [*policy.all_topics(topic), other_topic])
    failed: list[str] = []
    apply = effect(group)

    async def handler(env: Envelope, session: AsyncSession) -> None:
        if env.message_id == "m1" and not failed:
            failed.append("m1")
            raise RuntimeError("first try of m1 fails")
        await apply(env, session)

    handle = idempotent_consumer(rel, group=group)(handler)
    produce(tansu.bootstrap, topic, with_ids(["m1"]))

    def member(on: str, retry: RetryPolicy) -> AioKafkaGuardedConsumer:
        return AioKafkaGuardedConsumer(
            tansu.bootstrap, on, group, handle, retry=retry, config=AIO_FAST_GROUP, producer=NOT_IDEMPOTENT
        )

    async def scenario() -> None:
        first, second = member(topic, policy), member(other_topic, RetryPolicy(()))
        try:
            async with first:
                assert await first.run(until=lambda: first.counts["held"] >= 1, timeout_s=TIMEOUT_S)
                async with second:  # joins the group: a rebalance while m1 is held
                    staying = asyncio.create_task(second.run())
                    try:
                        assert await first.run(until=lambda: bool(second.assigned), timeout_s=TIMEOUT_S)
                        produce(tansu.bootstrap, topic, with_ids(["m2"]))
                        applied = await first.run(
                            until=lambda: effect_counts(rel.engine, group).get("m2") == 1, timeout_s=TIMEOUT_S
                        )
                        assert applied, f"m2 never applied (counts {dict(first.counts)})"
                    finally:
                        second.stop()
                        await staying
        finally:
            await rel.aclose()

    asyncio.run(scenario())
    assert effect_counts(rel.engine, group) == {"m1": 1, "m2": 1}
    assert committed(tansu.bootstrap, group, topic, 1) == [2]


def test_no_bootstrap_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="bootstrap"):
        AioKafkaSender("")


def test_a_sender_or_consumer_that_cannot_start_leaves_nothing_open() -> None:
    """No broker answers: ``async with`` raises from ``start()`` and never reaches ``__aexit__`` — the
    half-started producer (and the consumer's) stayed open, "Unclosed AIOKafkaProducer" at exit."""
    bootstrap = f"127.0.0.1:{listen_port()}"  # nothing listens there

    async def scenario() -> None:
        with pytest.raises(KafkaConnectionError):
            async with AioKafkaSender(bootstrap, timeout_s=2):
                pass

        async def decide(env: Envelope) -> None:
            return None

        consumer = AioKafkaGuardedConsumer(bootstrap, "orders", "billing", decide)
        with pytest.raises(KafkaConnectionError):
            async with consumer:
                pass
        del consumer
        gc.collect()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(scenario())
        gc.collect()
    assert [str(w.message) for w in caught if "Unclosed" in str(w.message)] == []
