"""A FastStream app behind the guard, end to end on the machine's RabbitMQ, PostgreSQL and Redis.

What a user of ``@reliable_subscriber`` needs: every message's effect applied once although RabbitMQ delivers
duplicates and the handler fails once; bad input (a different body under a known id, no id at all) in the
dead-letter queue with its reason, never silently acknowledged; nothing left in the queue.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import aio_pika
import pika
import pytest
from faststream.rabbit import RabbitBroker
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession

from reliable import Envelope, Reliability
from reliable.adapters.amqp import HEADER_DEAD_REASON, Topology
from reliable.adapters.rabbitmq_aio import AioRabbitMQSender, delete
from reliable.integrations.faststream import reliable_subscriber
from reliable.sender import OutgoingMessage
from tests.aio.flavours import applied, ledger, make_rel
from tests.conftest import _ensure_clean_schema

pytestmark = pytest.mark.rabbitmq
TIMEOUT_S = 30.0


@pytest.fixture
def rel(postgres_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    _ensure_clean_schema(postgres_url)
    # a twin delivered while its first runs is held until the first's lease ends (docs/adapters.md, "Delivery
    # limit and the lease"): a short lease keeps the concurrent duplicates below from waiting a minute
    r = make_rel(postgres_url, redis_url, key_prefix, max_attempts=3, lease_ms=2000)
    yield r
    r.close()


def test_a_faststream_subscriber_behind_the_guard_applies_each_message_once(
    rel: Reliability, rabbitmq_url: str
) -> None:
    queue = f"fs-{uuid.uuid4().hex[:10]}"
    failed_once: set[str] = set()
    broker = RabbitBroker(rabbitmq_url, logger=None)

    async def on_order(env: Envelope, session: AsyncSession) -> None:
        await session.execute(insert(ledger).values(message_id=env.message_id, grp="billing"))
        if env.message_id == "o-flaky" and env.message_id not in failed_once:
            failed_once.add(env.message_id)
            raise RuntimeError("transient")  # rolled back; the guard answers RECONSUME_LATER

    # the docs stack the two decorators; applied in two steps here to keep the counters in reach
    guarded = reliable_subscriber(rel, group="billing", retry_delay_s=0)(on_order)
    broker.subscriber(queue)(guarded)

    def send(message_id: str, body: bytes = b'{"amount": 1}') -> OutgoingMessage:
        return OutgoingMessage(message_id=message_id, topic=queue, body=body)

    async def scenario() -> list[str]:
        async with broker:
            await broker.start()
            async with AioRabbitMQSender(rabbitmq_url) as sender:
                for mid in ["o-1", "o-2", "o-1", "o-flaky", "o-2", "o-1"]:  # RabbitMQ-side duplicates
                    await sender.send(send(mid))
                await sender.send(send("o-1", b'{"amount": 999}'))  # a different body under a known id
            raw = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
            raw.channel().basic_publish("", queue, b"no id at all")
            raw.close()
            counts = guarded.counts  # type: ignore[attr-defined]
            deadline = asyncio.get_running_loop().time() + TIMEOUT_S
            while counts["ack"] + counts["dead_letter"] < 8:
                assert asyncio.get_running_loop().time() < deadline, f"not settled: {counts}"
                await asyncio.sleep(0.02)
            assert counts["requeue"] >= 1  # the flaky one (and lease conflicts between concurrent twins)
            conn = await aio_pika.connect(rabbitmq_url)
            async with conn:
                ch = await conn.channel()
                dlq = await ch.get_queue(f"{queue}.dlq", ensure=True)
                reasons = []
                while (m := await dlq.get(no_ack=True, fail=False)) is not None:
                    reasons.append(str(m.headers[HEADER_DEAD_REASON]).split(":")[0])
                left = await ch.get_queue(queue, ensure=True)
                assert await left.get(no_ack=True, fail=False) is None  # nothing left behind
                await delete(ch, Topology(queue))
        await rel.aclose()
        return sorted(reasons)

    assert asyncio.run(scenario()) == ["missing_message_id", "payload_mismatch"]
    assert applied(rel, "billing") == {"o-1": 1, "o-2": 1, "o-flaky": 1}
