"""RabbitMQ for asyncio (``aio-pika``): a consumer around an async guarded handler, and an async sender.

The same contract as the blocking adapter (:mod:`reliable.adapters.rabbitmq`, whose module doc has the full
mapping): manual acknowledgements, ``SUCCESS`` → ``basic.ack``, ``RECONSUME_LATER`` → ``basic.nack(requeue)``
after ``retry_delay_s`` (on a lease conflict: once the other worker's lease can have run out),
``DEAD_LETTER`` → a copy with the reason in ``x-reliable-dead-reason`` published (with a publisher confirm)
to ``{queue}.dlx`` and then ``basic.ack``; if that publish fails,
``basic.reject(requeue=False)`` lets the queue's own dead-letter exchange keep the message (without our
reason). A handler that raises is requeued, never acknowledged. Header names, the envelope mapping, the
result → action table and the dead-letter copy come from :mod:`reliable.adapters.amqp`, shared with the
blocking adapter and the FastStream integration.

Each delivery runs as its own task (aio-pika's doing), so up to ``prefetch`` messages are guarded
concurrently on one event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Protocol

import aio_pika
import aio_pika.exceptions
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
    ExchangeType,
)

from reliable import constants as C
from reliable.adapters import amqp
from reliable.adapters.amqp import Action, Topology
from reliable.errors import SendError
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.types import ConsumeResult, Envelope

log = logging.getLogger("reliable.adapters.rabbitmq")

AsyncGuardedHandler = Callable[[Envelope], Awaitable["ConsumeResult | amqp.HasResult"]]

#: what aio-pika / aiormq raise for a broker or connection failure
_AMQP_ERRORS = (aio_pika.exceptions.AMQPError, OSError, asyncio.TimeoutError)


def to_envelope(message: AbstractIncomingMessage, default_topic: str | None = None) -> Envelope:
    """The broker-neutral view of one aio-pika delivery (same rules as the blocking adapter)."""
    return amqp.envelope_from(
        message_id=message.message_id,
        headers=message.headers,
        exchange=message.exchange,
        routing_key=message.routing_key,
        redelivered=bool(message.redelivered),
        delivery_tag=int(message.delivery_tag or 0),
        type_=message.type,
        body=message.body,
        default_topic=default_topic,
    )


async def declare_dead_letter_path(channel: AbstractChannel, topology: Topology) -> AbstractExchange:
    """Create (idempotently) the DLX and the DLQ bound to it; returns the DLX."""
    dlx = await channel.declare_exchange(topology.dead_letter_exchange, ExchangeType.DIRECT, durable=True)
    dlq = await channel.declare_queue(topology.dead_letter_queue, durable=True)
    await dlq.bind(dlx, routing_key=topology.queue)
    return dlx


async def declare(channel: AbstractChannel, topology: Topology) -> AbstractQueue:
    """Create (idempotently) the DLX, the DLQ, the queue with its dead-letter arguments and the binding."""
    await declare_dead_letter_path(channel, topology)
    queue = await channel.declare_queue(topology.queue, durable=True, arguments=topology.declared_arguments())
    if topology.exchange:
        ex = await channel.declare_exchange(
            topology.exchange, ExchangeType(topology.exchange_type), durable=True
        )
        await queue.bind(ex, routing_key=topology.routing_key)
    return queue


async def delete(channel: AbstractChannel, topology: Topology) -> None:
    """Remove everything :func:`declare` created (tests; decommissioning)."""
    await channel.queue_delete(topology.queue)
    await channel.queue_delete(topology.dead_letter_queue)
    await channel.exchange_delete(topology.dead_letter_exchange)
    if topology.exchange:
        await channel.exchange_delete(topology.exchange)


class Delivery(Protocol):
    """What settles a delivery: an aio-pika ``IncomingMessage`` or FastStream's ``RabbitMessage``."""

    async def ack(self) -> None: ...
    async def nack(self, multiple: bool = ..., requeue: bool = ...) -> None: ...
    async def reject(self, requeue: bool = ...) -> None: ...


class DeadLetterPublisher:
    """Publishes the reasoned copy of a dead letter to ``{queue}.dlx`` on a confirming channel of its own.

    The first publish declares the DLX and the DLQ (idempotent), so a queue declared by someone else (a
    FastStream subscriber) still gets a dead-letter path that keeps the message.
    """

    def __init__(self, connection: AbstractConnection, topology: Topology) -> None:
        self.connection = connection
        self.topology = topology
        self._channel: AbstractChannel | None = None
        self._dlx: AbstractExchange | None = None
        #: one dead letter at a time: a retry replaces the channel, which a concurrent publish may be using
        self._lock = asyncio.Lock()

    async def publish(self, message: AbstractIncomingMessage, reason: str) -> None:
        """Raise on any failure (the caller then falls back to ``basic.reject(requeue=False)``). A failed
        publish is tried once more on a fresh channel that declares the dead-letter path again: the DLQ may
        have been deleted since, and the queue's own dead-lettering would route to the same missing place."""
        copy = aio_pika.Message(
            message.body, **amqp.dead_letter_properties(message, reason, self.topology.queue)
        )
        async with self._lock:
            try:
                await self._publish(copy)
            except _AMQP_ERRORS as exc:
                log.warning("dead-letter publish failed (%r); declaring the dead-letter path again", exc)
                self._dlx = None
                await self._publish(copy)

    async def _publish(self, copy: aio_pika.Message) -> None:
        if self._channel is None or self._channel.is_closed or self._dlx is None:
            if self._channel is not None and not self._channel.is_closed:
                await self._channel.close()
            self._channel = await self.connection.channel(publisher_confirms=True, on_return_raises=True)
            self._dlx = await declare_dead_letter_path(self._channel, self.topology)
        await self._dlx.publish(copy, routing_key=self.topology.queue, mandatory=True)


async def settle(
    delivery: Delivery,
    message: AbstractIncomingMessage,
    env: Envelope,
    answer: ConsumeResult | amqp.HasResult,
    dead_letters: DeadLetterPublisher,
    counts: Counter[str],
    retry_delay_s: float,
    *,
    reject_fallback: bool = True,
) -> Action:
    """Answer the broker for one guarded delivery (shared by the consumer and the FastStream integration).

    ``delivery`` is what acknowledges (``message`` itself, or a framework's wrapper of it). When the reasoned
    dead-letter copy cannot be published, ``reject_fallback`` rejects the delivery to the queue's own
    dead-letter exchange (only safe when the queue was declared with one, as :func:`declare` does);
    otherwise it is requeued — never dropped.
    """
    plan = amqp.settlement(answer, env, retry_delay_s)
    if plan.action is Action.ACK:
        await delivery.ack()
        counts["ack"] += 1
    elif plan.action is Action.REQUEUE:
        await requeue(delivery, counts, plan.delay_s)
    else:
        reason = plan.reason
        try:
            await dead_letters.publish(message, reason)
        except _AMQP_ERRORS as exc:
            counts["dead_letter_fallback"] += 1
            where = "to its own dead-letter exchange" if reject_fallback else "requeued"
            log.error(
                "dead-letter publish failed (%r); queue %s: %s", exc, dead_letters.topology.queue, where
            )
            if reject_fallback:
                await delivery.reject(requeue=False)
            else:
                await requeue(delivery, counts, retry_delay_s)
            return plan.action
        await delivery.ack()
        counts["dead_letter"] += 1
        log.warning(
            "message %s dead-lettered to %s: %s",
            env.message_id,
            dead_letters.topology.dead_letter_queue,
            reason,
        )
    return plan.action


async def judge_and_settle(
    delivery: Delivery,
    message: AbstractIncomingMessage,
    env: Envelope,
    decide: AsyncGuardedHandler,
    dead_letters: DeadLetterPublisher,
    counts: Counter[str],
    retry_delay_s: float,
    *,
    reject_fallback: bool,
) -> None:
    """Await the guard's answer for ``env`` and :func:`settle` the delivery (the consumer and the FastStream
    integration). An exception out of ``decide`` (a bare handler's bug) is counted as ``handler_error`` and
    the delivery requeued: never acknowledged, never rejected into a queue that may have no dead-letter
    exchange."""
    try:
        answer = await decide(env)
    except Exception as exc:
        counts["handler_error"] += 1
        log.exception("handler raised for message %s; requeued (%s)", env.message_id, type(exc).__name__)
        await requeue(delivery, counts, retry_delay_s)
        return
    await settle(
        delivery, message, env, answer, dead_letters, counts, retry_delay_s, reject_fallback=reject_fallback
    )


async def requeue(delivery: Delivery, counts: Counter[str], retry_delay_s: float) -> None:
    """Hold the delivery unacked ``retry_delay_s`` (no hot loop on a lease conflict; :func:`settle` passes
    :func:`~reliable.adapters.amqp.requeue_delay_s`: until another worker's lease can have run out), then
    nack+requeue."""
    counts["requeue"] += 1
    if retry_delay_s > 0:
        await asyncio.sleep(retry_delay_s)
    await delivery.nack(requeue=True)


class AioRabbitMQConsumer:
    """Consumes ``topology.queue`` with manual acks; each delivery is guarded by ``await handler(env)``.

    ``handler`` is what ``@idempotent_consumer`` returns for an ``async def`` handler (its ``decide`` is used
    when present, so a dead letter carries the guard's reason). Use ``async with`` or :meth:`start` /
    :meth:`close`.
    """

    def __init__(
        self,
        url: str,
        topology: Topology | str,
        handler: AsyncGuardedHandler,
        *,
        topic: str | None = None,
        prefetch: int = 16,
        retry_delay_s: float = 1.0,
        declare: bool = True,
    ) -> None:
        amqp.check_consumer_options(prefetch, retry_delay_s)
        self.url = url
        self.topology = Topology(topology) if isinstance(topology, str) else topology
        self.topic = topic
        self.prefetch = prefetch
        self.retry_delay_s = retry_delay_s
        self.declare = declare
        self._decide: AsyncGuardedHandler = amqp.decider(handler)
        #: what happened to deliveries so far: ack, requeue, dead_letter, dead_letter_fallback, handler_error
        self.counts: Counter[str] = Counter()
        self.connection: AbstractRobustConnection | None = None
        self._dead: DeadLetterPublisher | None = None
        self._queue: AbstractQueue | None = None
        self._tag: str | None = None

    async def start(self) -> None:
        """Connect, declare the topology (unless ``declare=False``) and start consuming."""
        self.connection = await aio_pika.connect_robust(self.url)
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=self.prefetch)
        if self.declare:
            self._queue = await declare(channel, self.topology)
        else:
            self._queue = await channel.get_queue(self.topology.queue, ensure=True)
        self._dead = DeadLetterPublisher(self.connection, self.topology)
        self._tag = await self._queue.consume(self._on_message, no_ack=False)

    async def close(self) -> None:
        """Stop consuming and close; unacknowledged deliveries go back to the queue (broker's doing)."""
        if self._queue is not None and self._tag is not None:
            try:
                await self._queue.cancel(self._tag)
            except _AMQP_ERRORS as exc:
                log.debug("cancel on close: %r", exc)
        if self.connection is not None:
            await self.connection.close()

    async def __aenter__(self) -> AioRabbitMQConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        assert self._dead is not None
        # a queue this consumer did not declare may have no dead-letter exchange: rejecting would drop
        await judge_and_settle(
            message,
            message,
            to_envelope(message, self.topic),
            self._decide,
            self._dead,
            self.counts,
            self.retry_delay_s,
            reject_fallback=self.declare,
        )


class AioRabbitMQSender:
    """An :class:`~reliable.sender.AsyncSender`: persistent messages, publisher confirms, ``mandatory``.

    ``await send(message)`` returns once the broker confirmed (and routed) the message; anything else raises
    :class:`SendError` and the stub stays PENDING for the sweeper. The receipt's ``queue_offset`` is the
    process-wide sequence number shared with the blocking sender. The connection is opened lazily, on the
    loop of the first send, and reopened once after a failure.
    """

    #: AMQP short strings (the message id, the tags header, header names) hold 255 bytes (staging checks)
    short_string_bytes = C.AMQP_SHORT_STRING_BYTES

    def __init__(
        self,
        url: str,
        *,
        exchange: str = "",
        routing_key: Callable[[OutgoingMessage], str] | None = None,
        group_queue: amqp.GroupQueue | None = None,
        mandatory: bool = True,
    ) -> None:
        self.url = url
        self.exchange_name = exchange
        self.routing_key = routing_key or (lambda m: m.topic)
        #: ``(topic, group) -> queue``: where a resend targeted at one group goes (default: the group's name)
        self.group_queue = group_queue or amqp.default_group_queue
        self.mandatory = mandatory
        self._conn: AbstractRobustConnection | None = None
        self._channel: AbstractChannel | None = None
        self._exchanges: dict[str, AbstractExchange] = {}
        self._lock: asyncio.Lock | None = None

    async def _target(self, name: str) -> AbstractExchange:
        if self._channel is None or self._conn is None or self._conn.is_closed or self._channel.is_closed:
            self._conn = await aio_pika.connect_robust(self.url)
            self._channel = await self._conn.channel(publisher_confirms=True, on_return_raises=True)
            self._exchanges = {"": self._channel.default_exchange}
        exchange = self._exchanges.get(name)
        if exchange is None:
            exchange = self._exchanges[name] = await self._channel.get_exchange(name, ensure=False)
        return exchange

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        pub = amqp.publication(message, self.routing_key(message))
        wire = aio_pika.Message(
            message.body,
            headers=pub.headers,
            message_id=pub.message_id,
            delivery_mode=amqp.PERSISTENT,
            content_type=amqp.CONTENT_TYPE,
            type=pub.type_,
            timestamp=pub.timestamp,
        )
        exchange_name, key = amqp.destination(message, self.exchange_name, pub.routing_key, self.group_queue)
        target = await self._target_or_fail(message, exchange_name)
        for attempt in (1, 2):
            try:
                await target.publish(wire, routing_key=key, mandatory=self.mandatory)
                break
            except aio_pika.exceptions.DeliveryError as exc:  # nack, or returned as unroutable
                returned = isinstance(exc, aio_pika.exceptions.PublishError)
                hint = amqp.unroutable_hint(message, key) if returned else ""
                raise SendError(f"message {message.message_id}: broker refused it: {exc}{hint}") from None
            except _AMQP_ERRORS as exc:
                await self._drop()
                if attempt == 2:
                    raise SendError(f"message {message.message_id}: {type(exc).__name__}: {exc}") from exc
                log.info("send of %s: %r; reconnecting once", message.message_id, exc)
                target = await self._target_or_fail(message, exchange_name)
        return SendReceipt(queue_id=0, queue_offset=pub.seq, broker_message_id=f"{exchange_name}/{pub.seq}")

    async def _target_or_fail(self, message: OutgoingMessage, exchange_name: str) -> AbstractExchange:
        if self._lock is None:
            self._lock = asyncio.Lock()
        try:
            async with self._lock:  # the connection is (re)opened by one task at a time
                return await self._target(exchange_name)
        except _AMQP_ERRORS as exc:
            await self._drop()
            raise SendError(f"message {message.message_id}: cannot connect: {exc!r}") from exc

    async def _drop(self) -> None:
        conn, self._conn, self._channel, self._exchanges = self._conn, None, None, {}
        if conn is not None and not conn.is_closed:
            try:
                await conn.close()
            except _AMQP_ERRORS as exc:
                log.debug("closing a failed connection: %r", exc)

    async def close(self) -> None:
        await self._drop()

    async def __aenter__(self) -> AioRabbitMQSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
