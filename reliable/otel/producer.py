"""Producer-side tracing: a ``create`` span when a stub is staged, a ``send`` span per hand-over.

Why the context is stored on the stub: the message's trace context must be the same on the producer's first
send and on every resend the sweeper makes hours later in another process. ``stage()`` starts the ``create``
span inside the caller's transaction (so it is a child of the request that wrote the order), writes its W3C
context into the outgoing message properties *and* into ``message_stub.trace_context`` (JSON of the carrier),
and the sweeper puts the stored context back into a resend's properties. Consumers link their
``process`` span to it (:func:`reliable.otel.consumer.producer_link`).

``create`` is a PRODUCER span (it creates the message's context); ``send`` is a CLIENT span linked to it, as
the messaging conventions ask when a creation context exists.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from reliable.otel import api
from reliable.otel import attrs as A
from reliable.otel.propagation import producer_link
from reliable.sender import OutgoingMessage, Sender, SendReceipt

#: property the sweeper marks its resends with (reliable.sweeper.resend.RESEND_PROPERTY)
_RESEND_PROPERTY = "RELIABLE_RESEND"


def create_context(system: str, message_id: str, topic: str, body_size: int) -> dict[str, str]:
    """Start and end the ``create {topic}`` span; return its propagation carrier (``traceparent`` …)."""
    span = api.tracer().start_span(
        f"{A.OP_CREATE} {topic}",
        kind=api.trace.SpanKind.PRODUCER,
        attributes={
            A.SYSTEM: system,
            A.OPERATION_NAME: A.OP_CREATE,
            A.OPERATION_TYPE: A.OP_CREATE,
            A.DESTINATION: topic,
            A.MESSAGE_ID: message_id,
            A.BODY_SIZE: body_size,
        },
    )
    carrier: dict[str, str] = {}
    api.propagate.inject(carrier, context=api.trace.set_span_in_context(span))
    span.end()
    return carrier


class TracingSender:
    """Wraps a :class:`Sender`: one ``send`` span per hand-over, linked to the context the message carries.

    The producer's first send carries the context of its ``create`` span; a sweeper resend carries the one
    stored on the stub (the sweeper selects it with the stub). A message without one (staged with telemetry
    off) gets the ``send`` span's own context. Other attributes of the wrapped object (a probe, ``close``)
    are passed through.
    """

    def __init__(self, sender: Sender, *, system: str) -> None:
        self.inner = sender
        self.system = system

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def send(self, message: OutgoingMessage) -> SendReceipt:
        props = dict(message.properties)
        resend = _RESEND_PROPERTY in props or message.send_count > 0
        target = getattr(message, "target_group", None)
        attributes: dict[str, Any] = {
            A.SYSTEM: self.system,
            A.OPERATION_NAME: A.OP_SEND,
            A.OPERATION_TYPE: A.OP_SEND,
            A.DESTINATION: message.topic,
            A.MESSAGE_ID: message.message_id,
            A.BODY_SIZE: len(message.body),
            A.SEND_COUNT: message.send_count,
            A.RESEND: resend,
        }
        if target:
            attributes[A.TARGET_GROUP] = target
        links = producer_link(props)
        kind = api.trace.SpanKind.CLIENT if links else api.trace.SpanKind.PRODUCER
        with api.tracer().start_as_current_span(
            f"{A.OP_SEND} {message.topic}", kind=kind, attributes=attributes, links=links
        ) as span:
            if not links:  # staged without tracing: the send span becomes the message's context
                api.propagate.inject(props)
                message = dataclasses.replace(message, properties=props)
            receipt = self.inner.send(message)
            span.set_attribute(A.PARTITION, str(receipt.queue_id))
            return receipt
