"""FastStream: run a subscriber behind the guard with one extra line.

::

    broker = RabbitBroker("amqp://guest:guest@127.0.0.1/")

    @broker.subscriber("billing-orders")
    @reliable_subscriber(rel, group="billing")
    async def on_order(env: Envelope, session: AsyncSession) -> None:
        session.add(Payment(order_id=json.loads(env.body)["order"]))

``reliable_subscriber`` wraps ``on_order`` with ``@idempotent_consumer`` (the async flavour) and gives
FastStream a function that takes the message from FastStream's context, turns it into an
:class:`~reliable.types.Envelope` with the same mapping as the aio-pika adapter, awaits the guard, and answers
the broker itself: ``ack``, ``nack(requeue=True)`` after ``retry_delay_s`` (a lease conflict: once the other
worker's lease can have run out, as the aio-pika adapter does), or — for ``DEAD_LETTER`` — a copy
with the reason in ``x-reliable-dead-reason`` published with a confirm to ``{queue}.dlx`` (declared on first
use, bound to ``{queue}.dlq``) and then ``ack``. If that publish fails the delivery is requeued, not rejected:
FastStream may have declared the queue without a dead-letter exchange, and a reject would then drop it.
:func:`faststream_consumer` does the same for a handler you guarded yourself.

Why the wrapper settles the message and not FastStream's ack policy: the guard's answer is the decision, and
a handler exception is already a guard outcome (``RECONSUME_LATER`` or ``DEAD_LETTER``), never an exception
FastStream would see. FastStream does not settle a message twice, so any ``ack_policy`` works.

Kafka: ``reliable_subscriber(rel, group=…, kafka=RetryPolicy(…))`` on a ``KafkaBroker`` subscriber (of the
topic and its retry topics) routes failures through retry topics to the DLT with the Kafka adapter's shared
code (:mod:`reliable.integrations.faststream_kafka`, which needs ``faststream[kafka]``).

Limits (RabbitMQ): the dead-letter names derive from the subscriber's queue name; with a broker ``prefix``
pass ``queue=`` with the full name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from faststream import Context
from faststream.rabbit.annotations import Connection, RabbitMessage

from reliable.adapters.amqp import Topology
from reliable.adapters.rabbitmq_aio import AsyncGuardedHandler, DeadLetterPublisher, settle, to_envelope
from reliable.errors import ConfigurationError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from reliable.adapters.kafka_common import RetryPolicy
    from reliable.types import Envelope

Consume = Callable[..., Awaitable[None]]


def faststream_consumer(
    handle: AsyncGuardedHandler,
    *,
    queue: str | Topology | None = None,
    topic: str | None = None,
    retry_delay_s: float = 1.0,
) -> Consume:
    """A FastStream subscriber function that runs every message through the guarded ``handle``."""
    if retry_delay_s < 0:
        raise ConfigurationError("retry_delay_s must be >= 0")
    decide = getattr(handle, "decide", None)
    judge: AsyncGuardedHandler = decide if callable(decide) else handle
    counts: Counter[str] = Counter()
    publishers: dict[str, DeadLetterPublisher] = {}

    async def consume(
        message: RabbitMessage, connection: Connection, subscriber: Any = Context("handler_")
    ) -> None:
        raw = message.raw_message
        env = to_envelope(raw, topic)
        answer = await judge(env)
        name = _queue_name(queue, subscriber, raw.routing_key)
        dead = publishers.get(name)
        if dead is None or dead.connection is not connection:
            topo = queue if isinstance(queue, Topology) else Topology(name)
            dead = publishers[name] = DeadLetterPublisher(connection, topo)
        await settle(message, raw, env, answer, dead, counts, retry_delay_s, reject_fallback=False)

    consume.counts = counts  # type: ignore[attr-defined]  # what happened so far (ack, requeue, dead_letter …)
    # the name only: FastStream reads ``consume``'s own signature, so no ``__wrapped__`` to ``handle``
    consume.__name__ = consume.__qualname__ = getattr(handle, "__name__", consume.__name__)
    return consume


def reliable_subscriber(
    rel: Any,
    group: str,
    *,
    queue: str | Topology | None = None,
    topic: str | None = None,
    retry_delay_s: float = 1.0,
    kafka: RetryPolicy | None = None,
    **guard_options: Any,
) -> Callable[[Callable[[Envelope, AsyncSession], Awaitable[None]]], Consume]:
    """``@idempotent_consumer(rel, group=…)`` plus :func:`faststream_consumer`, for ``async def`` handlers.

    ``kafka``: the subscriber is on FastStream's ``KafkaBroker``; retry topics and the DLT follow this
    policy (:mod:`reliable.integrations.faststream_kafka`; ``queue``/``retry_delay_s`` do not apply).
    """
    from reliable.decorator import idempotent_consumer

    def wrap(handler: Callable[[Envelope, AsyncSession], Awaitable[None]]) -> Consume:
        handle = idempotent_consumer(rel, group, **guard_options)(handler)
        if kafka is not None:
            from reliable.integrations.faststream_kafka import faststream_kafka_consumer

            return faststream_kafka_consumer(handle, retry=kafka, topic=topic)
        return faststream_consumer(handle, queue=queue, topic=topic, retry_delay_s=retry_delay_s)

    return wrap


def _queue_name(queue: str | Topology | None, subscriber: Any, routing_key: str | None) -> str:
    if isinstance(queue, Topology):
        return queue.queue
    if queue:
        return queue
    name = getattr(getattr(subscriber, "queue", None), "name", None)
    if isinstance(name, str) and name:
        return name
    if routing_key:
        return routing_key
    raise ConfigurationError("cannot tell the subscriber's queue: pass queue= to reliable_subscriber")
