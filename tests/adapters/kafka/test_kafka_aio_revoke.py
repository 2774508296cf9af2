"""The asyncio loop when the group takes a partition away while a record of it is being answered.

aiokafka rebalances in the background: a handler awaited for a while (a slow downstream call) can come back
after the partition it was reading went to another member. What a user needs: the member keeps consuming
its other work (it must not die on the answer), and the record is applied once in the group (the new owner
starts from the committed offset, which never moved past it).
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import AsyncSession

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.adapters.kafka import RetryMode, RetryPolicy, ensure_topics
from reliable.adapters.kafka.aio import AioKafkaGuardedConsumer
from reliable.demo.tansu import Tansu
from tests.adapters.kafka.helpers import TIMEOUT_S, effect_counts, produce, with_ids
from tests.adapters.kafka.test_kafka_aio import AIO_FAST_GROUP, NOT_IDEMPOTENT, effect

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.redis]


@pytest.mark.parametrize("mode", [RetryMode.BLOCKING, RetryMode.TOPICS])
def test_a_hold_on_a_partition_revoked_meanwhile_neither_kills_the_member_nor_loses_the_record(
    mode: RetryMode, tansu: Tansu, rel: Reliability, topic: str, group: str
) -> None:
    policy = RetryPolicy(delays_s=(0.3,), mode=mode)
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    entered, release = asyncio.Event(), asyncio.Event()
    failed: list[str] = []
    apply = effect(group)

    async def handler(env: Envelope, session: AsyncSession) -> None:
        if env.message_id == "m1" and not failed:
            failed.append("m1")
            entered.set()
            await release.wait()  # a slow downstream call; the group rebalances meanwhile
            raise ConnectionError("downstream timed out")
        await apply(env, session)

    handle = idempotent_consumer(rel, group=group)(handler)
    produce(tansu.bootstrap, topic, with_ids(["m1"]))

    def member(client_id: str) -> AioKafkaGuardedConsumer:
        config = {**AIO_FAST_GROUP, "client_id": client_id}
        return AioKafkaGuardedConsumer(
            tansu.bootstrap, topic, group, handle, retry=policy, config=config, producer=NOT_IDEMPOTENT
        )

    async def scenario() -> None:
        first, second = member("zz-first"), member("aa-second")
        try:
            async with first:
                running = asyncio.create_task(first.run())
                await asyncio.wait_for(entered.wait(), TIMEOUT_S)
                async with second:
                    taking = asyncio.create_task(second.run())
                    loop = asyncio.get_running_loop()
                    deadline = loop.time() + TIMEOUT_S
                    while (topic, 0) not in second.assigned and loop.time() < deadline:
                        await asyncio.sleep(0.05)  # polling the assignment with a deadline
                    assert (topic, 0) in second.assigned, "the partition never moved"
                    release.set()
                    while effect_counts(rel.engine, group).get("m1") != 1 and loop.time() < deadline:
                        await asyncio.sleep(0.05)
                        assert not running.done() or running.exception() is None, running.exception()
                    assert not running.done(), running.exception() if running.done() else None
                    second.stop()
                    first.stop()
                    await taking
                    await running
        finally:
            await rel.aclose()

    asyncio.run(scenario())
    assert effect_counts(rel.engine, group) == {"m1": 1}
