"""A FastStream app behind the guard, end to end on the machine's RabbitMQ, PostgreSQL and Redis.

What a user of ``@reliable_subscriber`` needs: every message's effect applied once although RabbitMQ delivers
duplicates and the handler fails once, whatever ``ack_policy`` FastStream is given — or the subscriber refused
before it consumes anything; bad input (a different body under a known id, no id at all) in the dead-letter
queue with its reason, never silently acknowledged; nothing left in the queue; the documented app starting
from a script; nothing published around the guard (FastStream publishers); a handler's exception never
dropping its message.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pytest
from faststream import AckPolicy
from faststream.rabbit import RabbitBroker
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncSession

from reliable import ConsumeResult, Envelope, Reliability
from reliable.adapters.amqp import HEADER_DEAD_REASON, Topology
from reliable.adapters.rabbitmq_aio import AioRabbitMQSender, delete
from reliable.errors import ConfigurationError
from reliable.integrations.faststream import faststream_consumer, reliable_subscriber
from reliable.sender import OutgoingMessage
from tests.aio.flavours import applied, ledger, make_rel
from tests.conftest import _ensure_clean_schema

pytestmark = pytest.mark.rabbitmq
TIMEOUT_S = 30.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def rel(postgres_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    _ensure_clean_schema(postgres_url)
    # a twin delivered while its first runs is held until the first's lease ends (docs/adapters.md, "Delivery
    # limit and the lease"): a short lease keeps the concurrent duplicates below from waiting a minute
    r = make_rel(postgres_url, redis_url, key_prefix, max_attempts=3, lease_ms=2000)
    yield r
    r.close()


@pytest.fixture
def queue(rabbitmq_url: str) -> Iterator[str]:
    name = f"fs-{uuid.uuid4().hex[:10]}"
    yield name

    async def drop() -> None:
        conn = await aio_pika.connect(rabbitmq_url)
        async with conn:
            await delete(await conn.channel(), Topology(name))
            await (await conn.channel()).queue_delete(f"{name}.out")

    asyncio.run(drop())


def send(message_id: str, queue: str, body: bytes = b'{"amount": 1}') -> OutgoingMessage:
    return OutgoingMessage(message_id=message_id, topic=queue, body=body)


async def until(check: Callable[[], bool], what: Callable[[], object]) -> None:
    deadline = asyncio.get_running_loop().time() + TIMEOUT_S
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"not settled: {what()}"
        await asyncio.sleep(0.02)


async def drain(rabbitmq_url: str, queue: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
    conn = await aio_pika.connect(rabbitmq_url)
    async with conn:
        q = await (await conn.channel()).get_queue(queue, ensure=True)
        got = []
        while (m := await q.get(no_ack=True, fail=False)) is not None:
            got.append(m)
        return got


def fails_once(failed: set[str]) -> Callable[[Envelope, AsyncSession], Any]:
    async def on_order(env: Envelope, session: AsyncSession) -> None:
        await session.execute(insert(ledger).values(message_id=env.message_id, grp="billing"))
        if env.message_id == "o-flaky" and env.message_id not in failed:
            failed.add(env.message_id)
            raise RuntimeError("transient")  # rolled back; the guard answers RECONSUME_LATER

    return on_order


@pytest.mark.parametrize(
    "policy",
    [None, AckPolicy.ACK, AckPolicy.NACK_ON_ERROR, AckPolicy.REJECT_ON_ERROR, AckPolicy.MANUAL, "ack_first"],
)
def test_a_faststream_subscriber_behind_the_guard_applies_each_message_once(
    rel: Reliability, rabbitmq_url: str, queue: str, policy: AckPolicy | str | None
) -> None:
    """Every FastStream ack policy either works or is refused before anything is consumed (ACK_FIRST consumes
    with no_ack: the guard's requeue of the failed message would be ignored and the message gone)."""
    broker = RabbitBroker(rabbitmq_url, logger=None)
    options: dict[str, Any] = {"ack_policy": AckPolicy.ACK_FIRST} if policy == "ack_first" else {}
    if isinstance(policy, AckPolicy):
        options["ack_policy"] = policy
    counts: Counter[str] = Counter()

    def register() -> None:
        sub = broker.subscriber(queue, no_reply=True, **options)
        reliable_subscriber(rel, group="billing", retry_delay_s=0, counts=counts, subscriber=sub)(
            fails_once(set())
        )

    try:
        register()
    except ConfigurationError as exc:  # refused before anything is consumed: only ACK_FIRST may be
        assert policy == "ack_first" and "pass ack_policy=AckPolicy.ACK" in str(exc)
        return

    async def scenario() -> list[str]:
        async with broker:
            await broker.start()
            async with AioRabbitMQSender(rabbitmq_url) as sender:
                for mid in ["o-1", "o-2", "o-1", "o-flaky", "o-2", "o-1"]:  # RabbitMQ-side duplicates
                    await sender.send(send(mid, queue))
                await sender.send(send("o-1", queue, b'{"amount": 999}'))  # a different body under a known id
            raw = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
            raw.channel().basic_publish("", queue, b"no id at all")
            raw.close()
            await until(lambda: counts["ack"] + counts["dead_letter"] >= 8, lambda: counts)
            assert counts["requeue"] >= 1  # the flaky one (and lease conflicts between concurrent twins)
            reasons = [
                str(m.headers[HEADER_DEAD_REASON]).split(":")[0]
                for m in await drain(rabbitmq_url, f"{queue}.dlq")
            ]
            assert await drain(rabbitmq_url, queue) == []  # nothing left behind
        await rel.aclose()
        return sorted(reasons)

    assert asyncio.run(scenario()) == ["missing_message_id", "payload_mismatch"]
    assert applied(rel, "billing") == {"o-1": 1, "o-2": 1, "o-flaky": 1}


def test_the_documented_app_starts_from_a_script_and_processes_a_message(
    rel: Reliability, rabbitmq_url: str, queue: str, postgres_url: str, redis_url: str, key_prefix: str
) -> None:
    """The module that starts the app holds ``RabbitMessage`` and aio-pika's ``Connection`` under those names:
    the integration's own annotations must not be looked up there."""

    argv = ["rabbit", rabbitmq_url, queue, "billing", postgres_url, redis_url, key_prefix, "1"]
    app = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "aio" / "faststream_app.py"), *argv],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert app.stdout is not None
        started = app.stdout.readline()  # "STARTED", or the start-up error's first line
        assert started.strip() == "STARTED", started + app.stdout.read()

        async def publish() -> None:
            async with AioRabbitMQSender(rabbitmq_url) as sender:
                await sender.send(send("o-script", queue))

        asyncio.run(publish())
        out, _ = app.communicate(timeout=60)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert app.returncode == 0 and "END o-script" in out, out
    with rel.engine.connect() as conn:
        rows = conn.execute(text("select message_id from faststream_app_effects where grp = 'billing'")).all()
    assert [r[0] for r in rows] == ["o-script"]


@pytest.mark.parametrize("where", ["stacked on top", "under it"])
def test_a_faststream_publisher_on_a_guarded_subscriber_is_refused_before_anything_is_consumed(
    rel: Reliability, rabbitmq_url: str, queue: str, where: str
) -> None:
    """FastStream publishes the handler's return value on every delivery, duplicates and the failed attempt
    included, outside the guard: a user expects one follow-up per applied message (AsyncStubProducer gives
    that), so a publisher on the subscriber is refused — at the latest when the subscriber starts."""
    broker = RabbitBroker(rabbitmq_url, logger=None)
    counts: Counter[str] = Counter()
    register = reliable_subscriber(
        rel,
        group="billing",
        retry_delay_s=0,
        counts=counts,
        subscriber=broker.subscriber(queue, no_reply=True),
    )
    out = broker.publisher(f"{queue}.out")
    if where == "under it":
        with pytest.raises(ConfigurationError, match="no FastStream decorator under it"):
            register(out(fails_once(set())))
        return
    out(register(fails_once(set())))

    async def scenario() -> int:
        conn = await aio_pika.connect(rabbitmq_url)
        async with conn:
            await (await conn.channel()).declare_queue(f"{queue}.out")
        async with broker:
            try:
                await broker.start()
            except ConfigurationError as exc:
                assert "@broker.publisher" in str(exc) and "AsyncStubProducer" in str(exc)
                return -1
            async with AioRabbitMQSender(rabbitmq_url) as sender:
                for mid in ["o-1", "o-1", "o-flaky"]:
                    await sender.send(send(mid, queue))
            await until(lambda: counts["ack"] >= 3, lambda: counts)
            await asyncio.sleep(0.3)
            return len(await drain(rabbitmq_url, f"{queue}.out"))

    published = asyncio.run(scenario())
    assert published == -1, f"{published} follow-ups for 2 applied messages"
    assert counts.total() == 0  # nothing consumed


def test_a_subscriber_that_would_answer_reply_to_is_refused(rel: Reliability, rabbitmq_url: str) -> None:
    broker = RabbitBroker(rabbitmq_url, logger=None)
    with pytest.raises(ConfigurationError, match="no_reply=True"):
        reliable_subscriber(rel, group="billing", subscriber=broker.subscriber("q"))
    with pytest.raises(ConfigurationError, match=r"subscriber=broker\.subscriber"):
        reliable_subscriber(rel, group="billing")


def test_a_guarded_handler_that_raises_leaves_its_message_in_the_queue(rabbitmq_url: str, queue: str) -> None:
    """``faststream_consumer`` with a handler that raises (a bare one, or an error out of the guard): the
    message is requeued and taken again, as the aio-pika consumer does — not rejected into a queue that
    FastStream declared without a dead-letter exchange."""
    calls: list[str] = []

    async def handle(env: Envelope) -> ConsumeResult:
        calls.append(env.message_id or "")
        if len(calls) == 1:
            raise RuntimeError("bug in a bare handler")
        return ConsumeResult.SUCCESS

    broker = RabbitBroker(rabbitmq_url, logger=None)
    counts: Counter[str] = Counter()
    faststream_consumer(
        handle, subscriber=broker.subscriber(queue, no_reply=True), retry_delay_s=0.05, counts=counts
    )

    async def scenario() -> None:
        async with broker:
            await broker.start()
            async with AioRabbitMQSender(rabbitmq_url) as sender:
                await sender.send(send("r-1", queue))
            await until(lambda: counts["ack"] >= 1, lambda: (calls, counts))

    asyncio.run(scenario())
    assert calls == ["r-1", "r-1"]
    assert counts["handler_error"] == 1 and counts["requeue"] == 1
