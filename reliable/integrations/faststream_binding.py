"""Registering a guarded function on a FastStream subscriber, refusing the settings that lose or repeat.

Why the integration registers the function itself
(``reliable_subscriber(…, subscriber=broker.subscriber(…))``) instead of being stacked under FastStream's
decorator: a setting that defeats the guard must be refused before
the subscriber consumes anything, and FastStream calls nothing of the inner function before it starts
consuming. Refused, each with a one-line :class:`~reliable.errors.ConfigurationError`:

- ``AckPolicy.ACK_FIRST`` (FastStream's default on Kafka): RabbitMQ consumes with ``no_ack=True`` and the
  guard's requeue is ignored; Kafka turns on aiokafka's auto-commit, which commits offsets while the handler
  runs — a crash loses the record. Every other policy is safe: the function settles each delivery itself
  and never raises into FastStream (what FastStream's policy would do on an exception never happens).
- a Kafka ``batch=True`` subscriber: the guard takes one record a call.
- publishers (``@broker.publisher`` on the handler) and answering ``reply_to`` (``no_reply=False``):
  FastStream publishes the function's return value on every delivery — duplicates and failed attempts
  included — outside the guard's transaction. Stage follow-ups through the handler's session
  (:class:`~reliable.aio_producer.AsyncStubProducer`) instead.

The check runs when the function is registered and again when the subscriber starts (FastStream applies the
subscriber's call decorators then, before its consumer exists): a publisher stacked on top afterwards, or a
router's ack policy, is refused then.
"""

from collections.abc import Callable
from typing import Any

from faststream import AckPolicy

from reliable.errors import ConfigurationError

SAFE_POLICIES = "AckPolicy.ACK, NACK_ON_ERROR, REJECT_ON_ERROR or MANUAL"


def refusal(subscriber: Any, *, kafka: bool) -> str | None:
    """Why ``subscriber`` cannot run a guarded function (``None``: it can)."""
    if subscriber is None:
        return (
            "reliable_subscriber needs subscriber=broker.subscriber(…): it checks the subscriber's settings "
            "before anything is consumed"
        )
    kind = _kind(subscriber)
    if kind is None:
        return f"subscriber= takes what broker.subscriber(…) returns, not {type(subscriber).__name__}"
    if kafka and kind != "kafka":
        return "kafka= needs a KafkaBroker subscriber"
    if not kafka and kind != "rabbit":
        return "a KafkaBroker subscriber needs reliable_subscriber(…, kafka=RetryPolicy(…))"
    if subscriber.ack_policy is AckPolicy.ACK_FIRST or getattr(subscriber, "_connection_args", {}).get(
        "enable_auto_commit"
    ):
        where = "Kafka's default; it auto-commits" if kafka else "it consumes with no_ack"
        return f"ack_policy ACK_FIRST ({where}) loses what fails: pass ack_policy=AckPolicy.ACK"
    if kafka and _is_kafka_batch(subscriber):
        return "reliable_subscriber(kafka=…) guards one record a call: drop batch=True"
    if not getattr(subscriber, "_no_reply", False):
        return (
            "pass no_reply=True to broker.subscriber(…): a reply_to answer would go out on every delivery, "
            "duplicates included; stage replies through the handler's session (AsyncStubProducer)"
        )
    if any(getattr(call.handler, "_publishers", ()) for call in subscriber.calls):
        return (
            "a guarded subscriber takes no @broker.publisher: FastStream publishes on every delivery, "
            "duplicates and failed attempts included; stage follow-ups with AsyncStubProducer"
        )
    return None


def check(subscriber: Any, *, kafka: bool) -> None:
    """Raise :class:`ConfigurationError` when ``subscriber`` cannot run a guarded function."""
    reason = refusal(subscriber, kafka=kafka)
    if reason is not None:
        raise ConfigurationError(reason)


def bind(subscriber: Any, consume: Callable[..., Any], *, kafka: bool) -> Any:
    """Check ``subscriber``, register ``consume`` on it and check again when it starts; returns what
    FastStream's decorator returns (its handler wrapper)."""
    check(subscriber, kafka=kafka)
    handler = subscriber(consume)

    def check_at_start(call: Callable[..., Any]) -> Callable[..., Any]:
        check(subscriber, kafka=kafka)
        return call

    # FastStream applies these when the subscriber starts, before it creates its consumer
    subscriber._call_decorators = (*subscriber._call_decorators, check_at_start)
    return handler


def _kind(subscriber: Any) -> str | None:
    from faststream.rabbit.subscriber.usecase import RabbitSubscriber

    if isinstance(subscriber, RabbitSubscriber):
        return "rabbit"
    try:
        from faststream.kafka.subscriber.usecase import LogicSubscriber
    except ImportError:  # faststream without its kafka extra: no Kafka subscriber exists
        return None
    return "kafka" if isinstance(subscriber, LogicSubscriber) else None


def _is_kafka_batch(subscriber: Any) -> bool:
    from faststream.kafka.subscriber.usecase import BatchSubscriber

    return isinstance(subscriber, BatchSubscriber)
