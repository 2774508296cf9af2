"""The aio-pika adapter against the machine's RabbitMQ: manual acks, requeue, DLX with reason, confirms.

The handler here is a plain async function answering a ConsumeResult, so each broker answer is driven
directly; the guard behind the same adapter is exercised in test_faststream.py and test_guard_aio.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aio_pika
import pika
import pytest

from reliable import ConsumeResult, Envelope
from reliable.adapters.amqp import HEADER_DEAD_REASON, HEADER_ORIGINAL_QUEUE, Topology
from reliable.adapters.rabbitmq import RabbitMQSender
from reliable.adapters.rabbitmq_aio import AioRabbitMQConsumer, AioRabbitMQSender, delete
from reliable.errors import SendError
from reliable.sender import OutgoingMessage

pytestmark = pytest.mark.rabbitmq
TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Answer:
    """A decision with a reason, as the guard's ``Decision`` carries one."""

    result: ConsumeResult
    reason: str
    detail: str | None = None


async def until(predicate: Callable[[], bool]) -> None:
    """Poll-with-timeout on the loop (the condition decides, not the sleep)."""
    deadline = asyncio.get_running_loop().time() + TIMEOUT_S
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached before the timeout")
        await asyncio.sleep(0.01)


async def drain(url: str, queue: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
    conn = await aio_pika.connect(url)
    out = []
    async with conn:
        ch = await conn.channel()
        q = await ch.get_queue(queue, ensure=True)
        while (m := await q.get(no_ack=True, fail=False)) is not None:
            out.append(m)
    return out


def run(
    url: str,
    decide: Callable[[Envelope], Awaitable[Any]],
    body: Callable[[AioRabbitMQConsumer], Awaitable[None]],
) -> AioRabbitMQConsumer:
    topo = Topology(queue=f"ra-{uuid.uuid4().hex[:12]}")

    async def scenario() -> AioRabbitMQConsumer:
        consumer = AioRabbitMQConsumer(url, topo, decide, retry_delay_s=0)
        try:
            async with consumer:
                await body(consumer)
        finally:
            conn = await aio_pika.connect(url)
            async with conn:
                await delete(await conn.channel(), topo)
        return consumer

    return asyncio.run(scenario())


def out(message_id: str | None, topic: str = "orders", **kw: Any) -> OutgoingMessage:
    return OutgoingMessage(message_id=message_id or "", topic=topic, body=b'{"n":1}', **kw)


def test_confirmed_send_then_ack_and_the_envelope_matches_the_blocking_adapters(rabbitmq_url: str) -> None:
    seen: list[Envelope] = []

    async def decide(env: Envelope) -> ConsumeResult:
        seen.append(env)
        return ConsumeResult.SUCCESS

    async def body(c: AioRabbitMQConsumer) -> None:
        q = c.topology.queue
        async with AioRabbitMQSender(rabbitmq_url, routing_key=lambda m: q) as sender:
            receipt = await sender.send(out("m-1", tags="created"))
        # one header codec and one routing rule for both: a resend targeted at a group goes to its queue
        with RabbitMQSender(rabbitmq_url, exchange="none", group_queue=lambda t, g: q) as blocking:
            blocking.send(out("m-2", target_group="billing"))
        await until(lambda: c.counts["ack"] == 2)
        assert receipt.queue_offset == seen[0].queue_offset  # the sequence number travels as the "offset"
        assert await drain(rabbitmq_url, q) == []

    run(rabbitmq_url, decide, body)
    assert [(e.message_id, e.topic, e.tags, e.reconsume_times) for e in seen] == [
        ("m-1", "orders", "created", 0),
        ("m-2", "orders", None, 0),
    ]
    assert seen[1].properties["x-reliable-group"] == "billing"
    assert seen[1].queue_offset > seen[0].queue_offset  # one sequence per process, shared by both senders


def test_reconsume_later_and_a_raising_handler_requeue_until_success(rabbitmq_url: str) -> None:
    deliveries: list[tuple[str | None, int]] = []

    async def decide(env: Envelope) -> ConsumeResult:
        deliveries.append((env.message_id, env.reconsume_times))
        n = sum(1 for m, _ in deliveries if m == env.message_id)
        if env.message_id == "later" and n == 1:
            return ConsumeResult.RECONSUME_LATER
        if env.message_id == "raises" and n == 1:
            raise RuntimeError("handler bug")
        return ConsumeResult.SUCCESS

    async def body(c: AioRabbitMQConsumer) -> None:
        q = c.topology.queue
        async with AioRabbitMQSender(rabbitmq_url, routing_key=lambda m: q) as sender:
            await sender.send(out("later"))
            await sender.send(out("raises"))
        await until(lambda: c.counts["ack"] == 2)

    c = run(rabbitmq_url, decide, body)
    assert c.counts["requeue"] == 2 and c.counts["handler_error"] == 1
    assert sorted(deliveries) == [("later", 0), ("later", 1), ("raises", 0), ("raises", 1)]


def test_dead_letter_goes_to_the_dlq_with_its_reason_and_is_acked(rabbitmq_url: str) -> None:
    async def decide(env: Envelope) -> Any:
        if env.message_id is None:
            return ConsumeResult.DEAD_LETTER
        return Answer(ConsumeResult.DEAD_LETTER, "payload_mismatch", "body differs")

    async def body(c: AioRabbitMQConsumer) -> None:
        q = c.topology.queue
        async with AioRabbitMQSender(rabbitmq_url, routing_key=lambda m: q) as sender:
            await sender.send(out("bad"))
        # a message without any id, published raw with pika (aiormq stamps a random id on what it publishes)
        blocking = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
        blocking.channel().basic_publish("", q, b"no id")
        blocking.close()
        await until(lambda: c.counts["dead_letter"] == 2)
        dead = await drain(rabbitmq_url, c.topology.dead_letter_queue)
        reasons = sorted(str(m.headers[HEADER_DEAD_REASON]) for m in dead)
        assert reasons == ["missing message id", "payload_mismatch: body differs"]
        assert {m.headers[HEADER_ORIGINAL_QUEUE] for m in dead} == {q}
        assert await drain(rabbitmq_url, q) == []  # acknowledged, not left behind or requeued

    run(rabbitmq_url, decide, body)


def test_a_dead_letter_queue_deleted_after_the_first_dead_letter_is_declared_again(rabbitmq_url: str) -> None:
    """The consumer's dead-letter channel declared the path at its first dead letter; then someone deleted
    the DLQ. The next reasoned copy is unroutable (rejecting would drop it: the queue's own dead-lettering
    goes to the same exchange), so it declares the path again and the copy lands there."""

    async def decide(env: Envelope) -> Any:
        return Answer(ConsumeResult.DEAD_LETTER, "max_attempts", f"attempt 3/3 of {env.message_id}")

    async def body(c: AioRabbitMQConsumer) -> None:
        q = c.topology.queue
        async with AioRabbitMQSender(rabbitmq_url, routing_key=lambda m: q) as sender:
            await sender.send(out("first"))
            await until(lambda: c.counts["dead_letter"] == 1)
            conn = await aio_pika.connect(rabbitmq_url)
            async with conn:
                await (await conn.channel()).queue_delete(c.topology.dead_letter_queue)
            await sender.send(out("second"))
            await until(lambda: c.counts["dead_letter"] == 2)
        assert c.counts["dead_letter_fallback"] == 0
        dead = await drain(rabbitmq_url, c.topology.dead_letter_queue)
        assert [str(m.headers[HEADER_DEAD_REASON]) for m in dead] == ["max_attempts: attempt 3/3 of second"]

    run(rabbitmq_url, decide, body)


def test_an_unroutable_send_is_not_accepted(rabbitmq_url: str) -> None:
    async def scenario() -> None:
        nowhere = f"nowhere-{uuid.uuid4().hex[:8]}"
        async with AioRabbitMQSender(rabbitmq_url, routing_key=lambda m: nowhere) as sender:
            with pytest.raises(SendError, match="refused"):
                await sender.send(out("lost"))

    asyncio.run(scenario())


def test_an_unroutable_targeted_resend_names_the_group_queue_setting(rabbitmq_url: str) -> None:
    """As the blocking sender: a group's resend goes to queue ``{group}`` unless told otherwise; when no such
    queue exists the error says which setting names it."""

    async def scenario() -> None:
        group = f"g-{uuid.uuid4().hex[:12]}"
        async with AioRabbitMQSender(rabbitmq_url) as sender:
            with pytest.raises(SendError) as targeted:
                await sender.send(OutgoingMessage("lost", "orders", b"x", target_group=group, send_count=1))
        text = str(targeted.value)
        assert "refused" in text and f"queue {group!r}" in text
        assert "RELIABLE_RABBITMQ_GROUP_QUEUE" in text and "group_queue" in text

    asyncio.run(scenario())


def test_declare_false_on_a_queue_without_a_dead_letter_exchange_keeps_what_it_cannot_dead_letter(
    rabbitmq_url: str,
) -> None:
    """As the blocking adapter: the operators' queue has no dead-letter exchange and the reasoned copy cannot
    be published; rejecting dropped the message, requeueing keeps it."""
    topo = Topology(queue=f"ra-{uuid.uuid4().hex[:12]}")

    async def decide(env: Envelope) -> ConsumeResult:
        return ConsumeResult.DEAD_LETTER

    async def scenario() -> int:
        conn = await aio_pika.connect(rabbitmq_url)
        async with conn:
            ch = await conn.channel()
            await ch.declare_queue(topo.queue, durable=True)  # no x-dead-letter-exchange
            await ch.declare_exchange(topo.dead_letter_exchange, aio_pika.ExchangeType.FANOUT)
            try:
                consumer = AioRabbitMQConsumer(rabbitmq_url, topo, decide, retry_delay_s=0, declare=False)
                async with consumer:
                    message = aio_pika.Message(b"keep me", message_id="k-1")
                    await ch.default_exchange.publish(message, routing_key=topo.queue)
                    await until(lambda: consumer.counts["dead_letter_fallback"] >= 2)
                return len(await drain(rabbitmq_url, topo.queue))
            finally:
                await delete(await conn.channel(), topo)

    assert asyncio.run(scenario()) == 1
