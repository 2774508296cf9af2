"""Trace context in message properties and on the stub: inject, store, read back, link.

Why links and not parent/child: a message is consumed long after (and often many times after) it was
produced; the messaging conventions model that as a *link* from each ``process`` span to the context the
producer created, so a redelivery or a resend hours later still points at the request that wrote it, and the
consumer's own trace stays short. Carriers are whatever the globally configured propagator writes (W3C
``traceparent``/``tracestate`` by default), stored as JSON text in ``message_stub.trace_context``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from reliable.models import mapping_from_json, mapping_json
from reliable.otel import api

log = logging.getLogger("reliable.otel")


def carrier_json(carrier: Mapping[str, str]) -> str | None:
    """What ``message_stub.trace_context`` stores: the propagation carrier as compact JSON (None if empty)."""
    return mapping_json(carrier)


def carrier_from_json(text: str | None) -> dict[str, str]:
    """The carrier stored on a stub; an unreadable value is treated as none (tracing never fails a send)."""
    return mapping_from_json(text, "trace_context", log, "the resend starts a new trace")


def producer_link(properties: Mapping[str, str]) -> list[Any]:
    """A span link to the producer's context in ``properties`` (empty when the message carries none)."""
    if not properties:
        return []
    ctx = api.propagate.extract(dict(properties))
    span_ctx = api.trace.get_current_span(ctx).get_span_context()
    return [api.trace.Link(span_ctx)] if span_ctx.is_valid else []
