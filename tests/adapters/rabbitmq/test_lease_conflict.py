"""A message whose Redis lease a killed worker left behind, on a quorum queue with ``x-delivery-limit``.

Why: a worker SIGKILLed mid-handler leaves its lease live for up to ``lease_ms``. Every redelivery meanwhile
is a lease conflict; requeued every ``retry_delay_s``, each one counted against the queue's delivery limit,
and the *broker* dead-lettered the message — without a reason, its handler never run, its inbox row PENDING
until the sweeper's stuck rule. Both consumers now hold such a delivery ``retry_delay_s × 2^n`` (n: the
queue's delivery count), never past the lease's end (the guard's ``Decision.retry_after_ms``, from the lease's
``PTTL``): a few deliveries per lease, and it is processed once, right after.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
import redis
from pika.spec import BasicProperties
from sqlalchemy.ext.asyncio import AsyncSession

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.adapters.amqp import requeue_delay_s
from reliable.adapters.rabbitmq import RabbitMQConsumer, Topology
from reliable.adapters.rabbitmq_aio import AioRabbitMQConsumer
from reliable.guard.decision import Decision, Reason
from reliable.stores.lease import lease_key
from tests.adapters.rabbitmq.conftest import (
    GROUP,
    TIMEOUT_S,
    TOPIC,
    effect_counts,
    effects,
    make_handler,
    queue_depth,
)

pytestmark = pytest.mark.rabbitmq

DELIVERY_LIMIT = 8
FOREIGN_LEASE_MS = 3000
RETRY_DELAY_S = 0.05  # 60 redeliveries during the foreign lease if each conflict were requeued this soon
#: holds of 0.05 × 2^n s: 0.05 + 0.1 + … + 1.6 s covers the 3 s lease in six requeues, a seventh at its edge
MAX_REQUEUES = 7


@pytest.fixture
def quorum(rabbitmq_url: str) -> Iterator[Topology]:
    name = f"rt-{uuid.uuid4().hex[:12]}"
    topo = Topology(
        queue=name,
        exchange=f"{name}.x",
        binding_key=TOPIC,
        queue_type="quorum",
        queue_arguments={"x-delivery-limit": DELIVERY_LIMIT},
    )
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        topo.declare(conn.channel())
        yield topo
        topo.delete(conn.channel())
    finally:
        conn.close()


def run_sync(rel: Reliability, url: str, topo: Topology, done: Any) -> dict[str, int]:
    consumer = RabbitMQConsumer(url, topo, make_handler(rel), retry_delay_s=RETRY_DELAY_S)
    try:
        assert consumer.run(until=done, timeout_s=TIMEOUT_S), f"not settled: {consumer.counts}"
    finally:
        consumer.close()
    return dict(consumer.counts)


def run_aio(rel: Reliability, url: str, topo: Topology, done: Any) -> dict[str, int]:
    @idempotent_consumer(rel, group=GROUP)
    async def handle(env: Envelope, session: AsyncSession) -> None:
        await session.execute(effects.insert().values(message_id=env.message_id))

    async def scenario() -> dict[str, int]:
        consumer = AioRabbitMQConsumer(url, topo, handle, retry_delay_s=RETRY_DELAY_S)
        try:
            async with consumer:
                deadline = asyncio.get_running_loop().time() + TIMEOUT_S
                while not done():
                    assert asyncio.get_running_loop().time() < deadline, f"not settled: {consumer.counts}"
                    await asyncio.sleep(0.05)
                return dict(consumer.counts)
        finally:
            await rel.aclose()

    return asyncio.run(scenario())


@pytest.mark.parametrize("flavour", ["sync", "aio"])
def test_a_dead_workers_lease_is_waited_out_not_spent_against_the_delivery_limit(
    flavour: str, rel: Reliability, rabbitmq_url: str, redis_url: str, quorum: Topology, admin: Any
) -> None:
    key = lease_key(rel.settings.key_prefix, GROUP, "lc-1")
    redis.Redis.from_url(redis_url).set(key, "processing:deadhost:1:1:abc0", px=FOREIGN_LEASE_MS)
    admin.confirm_delivery()
    admin.basic_publish(quorum.exchange, TOPIC, b"pay", BasicProperties(delivery_mode=2, message_id="lc-1"))

    def done() -> bool:  # processed, or dead-lettered by the broker
        return bool(effect_counts(rel)) or queue_depth(admin, quorum.dead_letter_queue) > 0

    counts = (run_sync if flavour == "sync" else run_aio)(rel, rabbitmq_url, quorum, done)

    assert effect_counts(rel) == {"lc-1": 1}
    assert queue_depth(admin, quorum.dead_letter_queue) == 0
    assert 1 <= counts["requeue"] <= MAX_REQUEUES  # not one requeue per retry_delay_s of the lease


@pytest.mark.parametrize(
    ("retry_after_ms", "reconsume_times", "held_s"),
    [
        (None, 0, 1.0),  # not a lease conflict: retry_delay_s
        (60_000, 0, 1.0),  # a twin beside a live worker: looked at again after retry_delay_s, not a minute
        (60_000, 1, 2.0),
        (60_000, 5, 32.0),
        (60_000, 6, 60.0),  # never past the lease's end
        (500, 3, 1.0),  # a lease about to lapse: still at least retry_delay_s
    ],
)
def test_a_lease_conflict_is_held_longer_with_each_delivery_but_never_past_the_lease(
    retry_after_ms: int | None, reconsume_times: int, held_s: float
) -> None:
    answer = Decision("m", Reason.LEASE_CONFLICT, retry_after_ms=retry_after_ms)
    assert requeue_delay_s(answer, 1.0, reconsume_times) == pytest.approx(held_s)
