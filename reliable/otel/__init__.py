"""OpenTelemetry for `reliable`: traces that follow a message from the producer's transaction to the handler.

Off by default (setting ``otel`` / ``RELIABLE_OTEL=1`` turns it on) and free when off: the functions below are
what the producer, the guard and the sweeper call, and each answers with the untraced path after one settings
test. The API package is an optional extra (``pip install 'reliable[otel]'``); the application installs the
SDK, its exporter and propagator as usual, and `reliable` uses the global providers.

What is emitted (names in :mod:`reliable.otel.attrs`):

* ``create {topic}`` (PRODUCER) when a stub is staged; its context travels in the message properties and is
  stored in ``message_stub.trace_context`` so every resend carries the same one;
* ``send {topic}`` (CLIENT, linked to ``create``) per hand-over to the broker, by the producer or the sweeper;
* ``process {topic}`` (CONSUMER, linked to ``create``) per delivery the guard decides, with the messaging
  attributes and ``reliable.outcome`` / ``reliable.reason`` / ``reliable.duplicate``;
* ``reliable.sweep`` (INTERNAL) per sweeper round, parent of that round's ``send`` spans;
* the Prometheus counters as OTel metrics (:func:`mirror_prometheus`, installed on the global meter provider
  by the first traced guard, producer or sweeper).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from reliable.otel import api
from reliable.otel import attrs as A
from reliable.otel.metrics import mirror_prometheus
from reliable.otel.propagation import carrier_json

if TYPE_CHECKING:  # the guard's modules are imported only when a guard asks for its hooks (no import cycle)
    from reliable.guard.decision import GuardHooks
    from reliable.sender import Sender

__all__ = ["guard_hooks", "mirror_prometheus", "stage_context", "traced_round", "traced_sender"]


def _system(rel: Any) -> str:
    return str(getattr(rel.settings, "otel_messaging_system", "rocketmq"))


def guard_hooks(rel: Any, group: str) -> tuple[GuardHooks, ...]:
    """The tracing hooks for a guard of ``group`` (none when telemetry is off)."""
    if not api.enabled(rel):
        return ()
    from reliable.otel.consumer import TracingHooks

    mirror_prometheus()
    return (TracingHooks(group, system=_system(rel)),)


def traced_sender(rel: Any, sender: Sender) -> Sender:
    """``sender`` wrapped with ``send`` spans (itself when telemetry is off or it is wrapped already)."""
    from reliable.otel.producer import TracingSender

    if not api.enabled(rel) or isinstance(sender, TracingSender):
        return sender
    mirror_prometheus()
    return TracingSender(sender, system=_system(rel))


def stage_context(
    rel: Any, message_id: str, topic: str, body: bytes, properties: Mapping[str, str] | None = None
) -> tuple[dict[str, str], str | None]:
    """The outgoing properties with the new message's trace context, and the JSON to store on its stub."""
    props = dict(properties or {})
    if not api.enabled(rel):
        return props, None
    from reliable.otel.producer import create_context

    carrier = create_context(_system(rel), message_id, topic, len(body))
    props.update(carrier)
    return props, carrier_json(carrier)


_Round = TypeVar("_Round", bound=Callable[..., Any])


def traced_round(run_once: _Round) -> _Round:
    """Decorates ``Sweeper.run_once``: a ``reliable.sweep`` span around each round (when telemetry is on).

    The round's summary (a dataclass of counts) becomes ``reliable.sweep.*`` attributes; a round that
    raises ends its span with the exception recorded.
    """

    @functools.wraps(run_once)
    def traced(sweeper: Any, *args: Any, **kwargs: Any) -> Any:
        if not api.enabled(sweeper.rel):
            return run_once(sweeper, *args, **kwargs)
        with api.tracer().start_as_current_span(A.SWEEP_SPAN, kind=api.trace.SpanKind.INTERNAL) as span:
            summary = run_once(sweeper, *args, **kwargs)
            fields = asdict(summary) if is_dataclass(summary) and not isinstance(summary, type) else {}
            for key, value in fields.items():
                if isinstance(value, int | float):
                    span.set_attribute(A.SWEEP_PREFIX + key, value)
            return summary

    return cast(_Round, traced)
