"""FastStream: run a subscriber behind the guard with one extra line.

::

    broker = RabbitBroker("amqp://guest:guest@127.0.0.1/", default_channel=Channel(prefetch_count=10))

    @reliable_subscriber(rel, group="billing", subscriber=broker.subscriber("billing-orders", no_reply=True))
    async def on_order(env: Envelope, session: AsyncSession) -> None:
        session.add(Payment(order_id=json.loads(env.body)["order"]))

``reliable_subscriber`` wraps ``on_order`` with ``@idempotent_consumer`` (the async flavour) and registers on
the subscriber a function that takes the message from FastStream's context, turns it into an
:class:`~reliable.types.Envelope` with the same mapping as the aio-pika adapter, awaits the guard, and answers
the broker itself: ``ack``, ``nack(requeue=True)`` after ``retry_delay_s`` (a lease conflict: once the other
worker's lease can have run out, as the aio-pika adapter does), or — for ``DEAD_LETTER`` — a copy
with the reason in ``x-reliable-dead-reason`` published with a confirm to ``{queue}.dlx`` (declared on first
use, bound to ``{queue}.dlq``) and then ``ack``. If that publish fails the delivery is requeued, not rejected:
FastStream may have declared the queue without a dead-letter exchange, and a reject would then drop it. An
exception out of the guard (a bare handler's bug) is counted (``handler_error``) and the message requeued.
:func:`faststream_consumer` does the same for a handler you guarded yourself.

Why it takes the subscriber (``subscriber=broker.subscriber(…)``) rather than being stacked under FastStream's
decorator: settings that lose or repeat messages are refused before anything is consumed —
``AckPolicy.ACK_FIRST`` (consumed with ``no_ack``: a failed message is gone), publishers and ``reply_to``
answers (``no_reply=True`` is required: FastStream would publish on every delivery, duplicates and failed
attempts included; stage follow-ups with :class:`~reliable.aio_producer.AsyncStubProducer` through the
handler's session). See :mod:`reliable.integrations.faststream_binding`. Every other ``ack_policy`` is safe:
the wrapper settles each message itself and FastStream does not settle a message twice.

Prefetch: FastStream's ``RabbitBroker`` sets none, and every delivery is its own task — a backlog becomes
that many concurrent guard calls, more than the async engine's pool holds, and the guard reads the pool's
timeout as a database outage (requeues). Pass ``default_channel=Channel(prefetch_count=…)`` (or a
subscriber's ``channel=``) no larger than the pool (``pool_size + max_overflow``).

Kafka: ``reliable_subscriber(rel, group=…, kafka=RetryPolicy(…), subscriber=…)`` on a ``KafkaBroker``
subscriber (of the topic and its retry topics) routes failures through retry topics to the DLT with the Kafka
adapter's shared code (:mod:`reliable.integrations.faststream_kafka`, which needs ``faststream[kafka]``).

Limits (RabbitMQ): the dead-letter names derive from the subscriber's queue name; with a broker ``prefix``
pass ``queue=`` with the full name.
"""

# no ``from __future__ import annotations``: FastStream resolves the annotations of ``consume`` when the
# subscriber starts, and string annotations would be looked up in the caller's frames first — a user's module
# that imported ``Connection`` or ``RabbitMessage`` under those names would break the subscriber
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from faststream.rabbit.annotations import Connection, RabbitMessage

from reliable.adapters.amqp import Topology
from reliable.adapters.rabbitmq_aio import (
    AsyncGuardedHandler,
    DeadLetterPublisher,
    judge_and_settle,
    to_envelope,
)
from reliable.errors import ConfigurationError
from reliable.integrations.faststream_binding import bind, check

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from reliable.adapters.kafka_common import RetryPolicy
    from reliable.types import Envelope

Consume = Callable[..., Awaitable[None]]
Handler = Callable[["Envelope", "AsyncSession"], Awaitable[None]]


def faststream_consumer(
    handle: AsyncGuardedHandler,
    *,
    subscriber: Any = None,
    queue: "str | Topology | None" = None,
    topic: "str | None" = None,
    retry_delay_s: float = 1.0,
    counts: "Counter[str] | None" = None,
) -> Any:
    """Register on ``subscriber`` (what ``broker.subscriber(…)`` returns) a function that runs every message
    through the guarded ``handle``; returns FastStream's handler wrapper.

    ``counts``: a counter of what happened (``ack``, ``requeue``, ``dead_letter``, ``handler_error`` …).
    """
    if retry_delay_s < 0:
        raise ConfigurationError("retry_delay_s must be >= 0")
    check(subscriber, kafka=False)
    decide = getattr(handle, "decide", None)
    judge: AsyncGuardedHandler = decide if callable(decide) else handle
    tally: Counter[str] = Counter() if counts is None else counts
    topology = queue if isinstance(queue, Topology) else Topology(_queue_name(queue, subscriber))
    publishers: list[DeadLetterPublisher] = []

    async def consume(message: RabbitMessage, connection: Connection) -> None:
        raw = message.raw_message
        if not publishers or publishers[0].connection is not connection:
            publishers[:] = [DeadLetterPublisher(connection, topology)]
        env = to_envelope(raw, topic)
        # FastStream may have declared the queue without a dead-letter exchange: requeue, never reject
        await judge_and_settle(
            message, raw, env, judge, publishers[0], tally, retry_delay_s, reject_fallback=False
        )

    # the name only: FastStream reads ``consume``'s own signature, so no ``__wrapped__`` to ``handle``
    consume.__name__ = consume.__qualname__ = getattr(handle, "__name__", consume.__name__)
    return bind(subscriber, consume, kafka=False)


def reliable_subscriber(
    rel: Any,
    group: str,
    *,
    subscriber: Any = None,
    queue: "str | Topology | None" = None,
    topic: "str | None" = None,
    retry_delay_s: float = 1.0,
    kafka: "RetryPolicy | None" = None,
    counts: "Counter[str] | None" = None,
    **guard_options: Any,
) -> Callable[[Handler], Any]:
    """``@idempotent_consumer(rel, group=…)`` registered on ``subscriber`` (``broker.subscriber(…)``), for
    ``async def`` handlers. The subscriber's settings are checked first (:mod:`.faststream_binding`).

    ``kafka``: the subscriber is on FastStream's ``KafkaBroker``; retry topics and the DLT follow this
    policy (:mod:`reliable.integrations.faststream_kafka`; ``queue``/``retry_delay_s`` do not apply).
    ``counts``: a counter of what happened, for tests and metrics.
    """
    from reliable.decorator import idempotent_consumer

    check(subscriber, kafka=kafka is not None)

    def wrap(handler: Handler) -> Any:
        if getattr(handler, "_publishers", None) is not None:
            raise ConfigurationError(
                "put reliable_subscriber directly on the handler, with no FastStream decorator under it"
            )
        handle = idempotent_consumer(rel, group, **guard_options)(handler)
        if kafka is not None:
            from reliable.integrations.faststream_kafka import faststream_kafka_consumer

            return faststream_kafka_consumer(
                handle, subscriber=subscriber, retry=kafka, topic=topic, counts=counts
            )
        return faststream_consumer(
            handle,
            subscriber=subscriber,
            queue=queue,
            topic=topic,
            retry_delay_s=retry_delay_s,
            counts=counts,
        )

    return wrap


def _queue_name(queue: "str | None", subscriber: Any) -> str:
    if queue:
        return queue
    name = getattr(getattr(subscriber, "queue", None), "name", None)
    if isinstance(name, str) and name:
        return name
    raise ConfigurationError("cannot tell the subscriber's queue: pass queue= to reliable_subscriber")
