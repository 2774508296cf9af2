"""The aio-pika consumer behind the guard, fed raw AMQP messages the way other clients publish them.

Why these tests: aio-pika (pamqp) hands headers over in other Python types than pika does — a byte-array
field (``x``, what pika and Java clients write for ``bytes``/``byte[]``) arrives as ``bytearray`` — and
aiormq stamps a ``message_id`` on any publish without one. Both changed what the guard saw: an id header
became the id ``"bytearray(b'…')"`` (the same message under its real id then applied its effect a second
time), a non-UTF-8 id was processed instead of dead-lettered, and the dead-letter copy of a message without
an id got a random one, under which a replay of the dead-letter queue then processed it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pika
import pytest
from pika.spec import BasicProperties
from sqlalchemy.ext.asyncio import AsyncSession

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.adapters.amqp import HEADER_DEAD_REASON, HEADER_ORIGINAL_MESSAGE_ID, HEADER_TOPIC
from reliable.adapters.rabbitmq import Topology
from reliable.adapters.rabbitmq_aio import AioRabbitMQConsumer
from tests.adapters.rabbitmq.conftest import TIMEOUT_S, TOPIC, dlq_messages, effect_counts, effects

pytestmark = pytest.mark.rabbitmq

GROUP = "rmq-aio"


def publish(admin: Any, topology: Topology, body: bytes, **props: Any) -> None:
    """Publish through the topology's exchange with pika (``bytes`` header values go out as byte arrays)."""
    admin.confirm_delivery()
    admin.basic_publish(topology.exchange, TOPIC, body, BasicProperties(delivery_mode=2, **props))


def consume(rel: Reliability, url: str, topology: Topology, settled: int, calls: list[str | None]) -> Any:
    """Run an aio consumer behind the guard until ``settled`` deliveries were acked or dead-lettered."""

    @idempotent_consumer(rel, group=GROUP)
    async def handle(env: Envelope, session: AsyncSession) -> None:
        calls.append(env.message_id)
        await session.execute(effects.insert().values(message_id=env.message_id))

    async def scenario() -> dict[str, int]:
        consumer = AioRabbitMQConsumer(url, topology, handle, retry_delay_s=0.05)
        try:
            async with consumer:
                deadline = asyncio.get_running_loop().time() + TIMEOUT_S
                while consumer.counts["ack"] + consumer.counts["dead_letter"] < settled:
                    assert asyncio.get_running_loop().time() < deadline, f"not settled: {consumer.counts}"
                    await asyncio.sleep(0.01)
        finally:
            await rel.aclose()
        return dict(consumer.counts)

    return asyncio.run(scenario())


@pytest.fixture
def declared(rabbitmq_url: str, topology: Topology) -> Topology:
    """The test's topology with its exchange, queue and dead-letter path declared (messages are published
    before the consumer, which would declare them, starts)."""
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        topology.declare(conn.channel())
    finally:
        conn.close()
    return topology


def reasons(admin: Any, topology: Topology) -> list[str]:
    return sorted(
        str(props.headers[HEADER_DEAD_REASON]).split(":")[0] for props, _ in dlq_messages(admin, topology)
    )


def test_an_id_header_sent_as_bytes_is_the_id_and_a_copy_under_the_id_property_is_its_duplicate(
    rel: Reliability, rabbitmq_url: str, declared: Topology, admin: Any
) -> None:
    topology = declared
    calls: list[str | None] = []
    publish(admin, topology, b"pay 10", headers={"message-id": b"order-1", HEADER_TOPIC: TOPIC.encode()})
    publish(admin, topology, b"pay 10", message_id="order-1")  # the same message, e.g. a sweeper resend

    counts = consume(rel, rabbitmq_url, topology, 2, calls)

    assert calls == ["order-1"]
    assert effect_counts(rel) == {"order-1": 1}
    assert counts.get("dead_letter", 0) == 0


def test_an_id_or_topic_header_that_is_not_utf8_is_dead_lettered_as_bad_input(
    rel: Reliability, rabbitmq_url: str, declared: Topology, admin: Any
) -> None:
    topology = declared
    calls: list[str | None] = []
    publish(admin, topology, b"a", headers={"message-id": b"id\xff"})
    publish(admin, topology, b"b", message_id="bt-1", headers={HEADER_TOPIC: b"ord\xffers"})

    counts = consume(rel, rabbitmq_url, topology, 2, calls)

    assert calls == []
    assert counts["dead_letter"] == 2
    assert reasons(admin, topology) == ["bad_message", "bad_message"]


def test_a_replayed_dead_letter_of_a_message_without_an_id_is_dead_lettered_again_not_processed(
    rel: Reliability, rabbitmq_url: str, declared: Topology, admin: Any
) -> None:
    topology = declared
    calls: list[str | None] = []
    publish(admin, topology, b"no id at all")
    assert consume(rel, rabbitmq_url, topology, 1, calls)["dead_letter"] == 1
    [(copy, body)] = dlq_messages(admin, topology)

    # a routine replay: the copy, as it is, back into the queue
    admin.basic_publish("", topology.queue, body, copy)
    counts = consume(rel, rabbitmq_url, topology, 1, calls)

    assert calls == []
    assert effect_counts(rel) == {}
    assert counts["dead_letter"] == 1
    [(again, _)] = dlq_messages(admin, topology)
    assert str(again.headers[HEADER_DEAD_REASON]).startswith("missing_message_id")
    assert copy.headers[HEADER_ORIGINAL_MESSAGE_ID] == again.headers[HEADER_ORIGINAL_MESSAGE_ID] == ""
