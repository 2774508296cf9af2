"""RabbitMQ adapter (``pika``): a consumer loop around a guarded handler, and a confirming :class:`Sender`.

Consumer: every delivery becomes an :class:`~reliable.types.Envelope` and goes to ``handler(env)`` (what
``@idempotent_consumer`` returns; a :class:`reliable.guard.Guard` works too, its ``Decision`` carries the
reason). Acknowledgements are manual and follow the result:

==================  ==============================================================================
``SUCCESS``         ``basic.ack``
``RECONSUME_LATER`` ``basic.nack(requeue=True)`` after ``retry_delay_s`` (held unacked meanwhile, so a
                    lease conflict does not spin the queue at full speed); on a lease conflict, after the
                    other worker's lease can have run out if that is later (``Decision.retry_after_ms``),
                    so a killed worker's lease does not spend a quorum queue's ``x-delivery-limit``
``DEAD_LETTER``     a copy, with the reason in the ``x-reliable-dead-reason`` header, published with a
                    publisher confirm to the dead-letter exchange ``{queue}.dlx`` (bound to ``{queue}.dlq``),
                    then ``basic.ack``. RabbitMQ's own dead-lettering (``basic.reject(requeue=False)`` on a
                    queue with ``x-dead-letter-exchange``) cannot carry an application reason, so it is only
                    the fallback when that publish fails: the message still lands in the DLQ, with
                    ``x-death`` but without our reason. Nothing is ever acknowledged silently.
handler raised      logged and counted, then treated as ``RECONSUME_LATER`` (the guard never raises; a bare
                    handler that does must not lose the message)
==================  ==============================================================================

Envelope mapping: ``message_id`` from the AMQP ``message_id`` property, else the ``message-id`` /
``x-message-id`` header (none: the guard dead-letters it with ``missing message id``). ``topic`` from the
``x-reliable-topic`` header the sender stamps, else the consumer's ``topic``, else the routing key.
``reconsume_times`` from ``x-delivery-count`` (quorum queues count requeues; ``queue_type="quorum"``), else
1 for a delivery flagged ``redelivered`` and 0 otherwise. ``queue_id`` is 0 and ``queue_offset`` is the
sender's sequence number (``x-reliable-seq``), else the delivery tag.

What the resend sweeper can and cannot infer with RabbitMQ: a queue has no offsets, so the "position" is the
sender's clock (``x-reliable-seq``: microseconds since the epoch, strictly increasing within a process,
:func:`reliable.adapters.amqp.next_seq`). "Stub position at or below the group's watermark" then means "sent
before a message the group has received", in any producer process whose clock agrees — a copy queued
behind a paused group is held, not re-sent. There is no loss probe: a copy the group has not passed is
re-sent once it is ``max_unconfirmed_age`` old. The reconciliation report tells these clock positions from
offsets by their scale (never below ``AMQP_CLOCK_POSITION_MIN``) and computes no offset gaps and no lag
from them; *lost* (the group's position passed a message it never received) still holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel
from pika.spec import Basic, BasicProperties

from reliable.adapters import amqp
from reliable.adapters.amqp import (  # re-exported: the header names are part of this module's API
    DELIVERY_COUNT,
    HEADER_DEAD_REASON,
    HEADER_GROUP,
    HEADER_ORIGINAL_QUEUE,
    HEADER_SEND_COUNT,
    HEADER_SEQ,
    HEADER_TAGS,
    HEADER_TOPIC,
    ID_HEADERS,
    Action,
)
from reliable.adapters.rabbitmq_send import RabbitMQSender, connect, sweeper_sender
from reliable.types import ConsumeResult, Envelope

log = logging.getLogger("reliable.adapters.rabbitmq")

__all__ = [
    "DELIVERY_COUNT",
    "HEADER_DEAD_REASON",
    "HEADER_GROUP",
    "HEADER_ORIGINAL_QUEUE",
    "HEADER_SEND_COUNT",
    "HEADER_SEQ",
    "HEADER_TAGS",
    "HEADER_TOPIC",
    "ID_HEADERS",
    "RabbitMQConsumer",
    "RabbitMQSender",
    "Topology",
    "sweeper_sender",
    "to_envelope",
]

GuardedHandler = Callable[[Envelope], "ConsumeResult | amqp.HasResult"]


class Topology(amqp.Topology):
    """The names of :class:`reliable.adapters.amqp.Topology`, declared and removed over a pika channel."""

    __slots__ = ()

    def declare(self, ch: BlockingChannel) -> None:
        """Create (idempotently) the DLX, the DLQ, the queue with its dead-letter arguments, the binding."""
        self.declare_dead_letter_path(ch)
        ch.queue_declare(self.queue, durable=True, arguments=self.declared_arguments())
        if self.exchange:
            ch.exchange_declare(self.exchange, exchange_type=self.exchange_type, durable=True)
            ch.queue_bind(self.queue, self.exchange, routing_key=self.routing_key)

    def declare_dead_letter_path(self, ch: BlockingChannel) -> None:
        """Create (idempotently) the DLX and the DLQ bound to it."""
        ch.exchange_declare(self.dead_letter_exchange, exchange_type="direct", durable=True)
        ch.queue_declare(self.dead_letter_queue, durable=True)
        ch.queue_bind(self.dead_letter_queue, self.dead_letter_exchange, routing_key=self.queue)

    def delete(self, ch: BlockingChannel) -> None:
        """Remove everything :meth:`declare` created (tests; decommissioning)."""
        ch.queue_delete(self.queue)
        ch.queue_delete(self.dead_letter_queue)
        ch.exchange_delete(self.dead_letter_exchange)
        if self.exchange:
            ch.exchange_delete(self.exchange)


def to_envelope(
    method: Basic.Deliver, props: BasicProperties, body: bytes, default_topic: str | None = None
) -> Envelope:
    """The broker-neutral view of one delivery (see the module doc for where each field comes from)."""
    return amqp.envelope_from(
        message_id=props.message_id,
        headers=props.headers,
        exchange=method.exchange,
        routing_key=method.routing_key,
        redelivered=bool(method.redelivered),
        delivery_tag=int(method.delivery_tag),
        type_=props.type,
        body=body,
        default_topic=default_topic,
    )


class RabbitMQConsumer:
    """Consumes ``topology.queue`` with manual acks and maps each guarded result to an AMQP answer.

    Not thread-safe (pika's blocking connection is not): run one consumer per thread or process.
    """

    def __init__(
        self,
        url: str,
        topology: Topology | str,
        handler: GuardedHandler,
        *,
        topic: str | None = None,
        prefetch: int = 16,
        retry_delay_s: float = 1.0,
        declare: bool = True,
        connection_name: str | None = None,
    ) -> None:
        amqp.check_consumer_options(prefetch, retry_delay_s)
        self.topology = Topology(topology) if isinstance(topology, str) else topology
        self.handler = handler
        self.topic = topic
        self.retry_delay_s = retry_delay_s
        # a queue this consumer did not declare may have no dead-letter exchange: rejecting would drop
        self._reject_fallback = declare
        self._decide: GuardedHandler = amqp.decider(handler)
        #: what happened to deliveries so far: ack, requeue, dead_letter, dead_letter_fallback, handler_error
        self.counts: Counter[str] = Counter()
        self._stop = threading.Event()
        self.connection = connect(url, connection_name)
        self.channel = self.connection.channel()
        self._dlx_channel: BlockingChannel | None = None
        if declare:
            self.topology.declare(self.channel)
        self.channel.basic_qos(prefetch_count=prefetch)
        self._tag = self.channel.basic_consume(self.topology.queue, self._on_message, auto_ack=False)

    # --- loop ------------------------------------------------------------------------------------------

    def run(self, until: Callable[[], bool] | None = None, timeout_s: float | None = None) -> bool:
        """Consume until ``until()`` is true, :meth:`stop` is called, or ``timeout_s`` passes.

        Returns whether it ended because ``until()`` became true (``False`` on timeout or stop).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._stop.is_set():
            if until is not None and until():
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            self.connection.process_data_events(time_limit=0.05)
        return False

    def stop(self) -> None:
        """Ask :meth:`run` to return (safe from another thread or a signal handler)."""
        self._stop.set()

    def close(self) -> None:
        """Close the connection; deliveries not yet acknowledged go back to the queue (broker's doing)."""
        if self.connection.is_open:
            self.connection.close()

    def __enter__(self) -> RabbitMQConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one delivery -----------------------------------------------------------------------------------

    def _on_message(
        self, ch: BlockingChannel, method: Basic.Deliver, props: BasicProperties, body: bytes
    ) -> None:
        env = to_envelope(method, props, body, self.topic)
        try:
            answer = self._decide(env)
        except Exception as exc:  # a bare handler's bug: never ack, never lose the message
            self.counts["handler_error"] += 1
            log.exception("handler raised for message %s; requeued", env.message_id)
            self._requeue(ch, method.delivery_tag, f"handler raised {type(exc).__name__}")
            return
        plan = amqp.settlement(answer, env, self.retry_delay_s)
        if plan.action is Action.ACK:
            ch.basic_ack(method.delivery_tag)
            self.counts["ack"] += 1
        elif plan.action is Action.REQUEUE:
            self._requeue(ch, method.delivery_tag, "RECONSUME_LATER", plan.delay_s)
        else:
            self._dead_letter(ch, method, props, body, plan.reason)

    def _requeue(self, ch: BlockingChannel, tag: int, why: str, delay_s: float | None = None) -> None:
        """nack+requeue after ``delay_s`` (default ``retry_delay_s``), the delivery held unacked meanwhile."""
        delay = self.retry_delay_s if delay_s is None else delay_s
        self.counts["requeue"] += 1
        log.debug("delivery %d: nack+requeue (%s) in %.2fs", tag, why, delay)
        if delay == 0:
            ch.basic_nack(tag, requeue=True)
            return

        def later() -> None:
            if ch.is_open:
                ch.basic_nack(tag, requeue=True)

        self.connection.call_later(delay, later)

    def _dead_letter(
        self, ch: BlockingChannel, method: Basic.Deliver, props: BasicProperties, body: bytes, reason: str
    ) -> None:
        copy = BasicProperties(**amqp.dead_letter_properties(props, reason, self.topology.queue))
        try:
            try:
                self._publish_dead_letter(body, copy, declare=False)
            except (pika.exceptions.AMQPError, OSError) as exc:
                # the DLQ or the DLX may be gone (deleted by hand, or never declared: declare=False); the
                # queue's own dead-lettering would route to the same missing place and drop the message
                log.warning("dead-letter publish failed (%r); declaring the dead-letter path again", exc)
                self._publish_dead_letter(body, copy, declare=True)
        except (pika.exceptions.AMQPError, OSError) as exc:
            self.counts["dead_letter_fallback"] += 1
            if not self._reject_fallback:
                # declare=False: the queue is someone else's, and may have no dead-letter exchange (then a
                # reject drops the message): it stays in the queue, and this error repeats until it is fixed
                log.error("dead-letter publish failed (%r); queue %s: requeued", exc, self.topology.queue)
                self._requeue(ch, method.delivery_tag, "dead-letter path unusable")
                return
            # the broker's own dead-lettering (this consumer declared it) keeps it, without our reason
            log.error(
                "dead-letter publish failed (%r); rejecting to queue %s's own dead-letter exchange",
                exc,
                self.topology.queue,
            )
            ch.basic_reject(method.delivery_tag, requeue=False)
            return
        ch.basic_ack(method.delivery_tag)
        self.counts["dead_letter"] += 1
        log.warning(
            "message %s dead-lettered to %s: %s", props.message_id, self.topology.dead_letter_queue, reason
        )

    def _publish_dead_letter(self, body: bytes, copy: BasicProperties, *, declare: bool) -> None:
        """Publish the reasoned copy with a confirm; ``declare``: on a fresh channel, after declaring the
        dead-letter path again."""
        if declare and self._dlx_channel is not None and self._dlx_channel.is_open:
            self._dlx_channel.close()
        if declare or self._dlx_channel is None or not self._dlx_channel.is_open:
            self._dlx_channel = self.connection.channel()
            self._dlx_channel.confirm_delivery()
        if declare:
            self.topology.declare_dead_letter_path(self._dlx_channel)
        self._dlx_channel.basic_publish(
            self.topology.dead_letter_exchange, self.topology.queue, body, copy, mandatory=True
        )
