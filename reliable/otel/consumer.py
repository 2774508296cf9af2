"""A ``process`` span per delivery, built from the guard's :class:`~reliable.decision.GuardHooks`.

Why hooks and not a wrapper: the hooks are the guard's stable observation points (they survive the guard's
restructuring), they see each delivery of a batch separately, and ``before_handler`` is the one place where
the handler's own spans can be made children of the delivery's span.

Life of one span::

    before_journal(envs)  start "process {topic}" (CONSUMER) per delivery, linked to the producer's
                          context carried in the message properties (W3C traceparent)
    before_handler(env)   make it the current span, so the handler's spans (SQL, HTTP) nest under it
    after_handler(env, e) restore the previous context; record the handler's exception
    after_decision(env,d) set outcome/reason/result/duplicate, ERROR status for a dead letter, end it

A delivery decided without a journal step (Redis answered ``done`` and the write-behind journal took the row,
or the database was unreachable) gets its span at ``after_decision``: a zero-length span, but every delivery
has exactly one.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from reliable.guard.decision import Decision, GuardHooks
from reliable.otel import api
from reliable.otel import attrs as A
from reliable.otel.propagation import producer_link
from reliable.types import ConsumeResult, Envelope


class TracingHooks(GuardHooks):
    """Emits one consumer span per delivery for consumer group ``group`` (thread-safe: state per thread)."""

    def __init__(self, group: str, *, system: str, tracer: Any | None = None) -> None:
        self.group = group
        self.system = system
        self.tracer = tracer if tracer is not None else api.tracer()
        # open spans and attached contexts by delivery (``id(env)``: unique while the guard holds the env);
        # not thread-local, so the same hooks serve worker threads and asyncio tasks alike
        self._lock = threading.Lock()
        self._spans: dict[int, list[Any]] = {}
        self._tokens: dict[int, Any] = {}

    def _start(self, env: Envelope) -> Any:
        topic = env.topic
        attributes: dict[str, Any] = {
            A.SYSTEM: self.system,
            A.OPERATION_NAME: A.OP_PROCESS,
            A.OPERATION_TYPE: A.OP_PROCESS,
            A.DESTINATION: topic,
            A.PARTITION: str(env.queue_id),
            A.CONSUMER_GROUP: self.group,
            A.BODY_SIZE: len(env.body),
            A.RECONSUME_TIMES: env.reconsume_times,
        }
        if env.message_id:
            attributes[A.MESSAGE_ID] = env.message_id
        if env.keys:
            attributes[A.ROCKETMQ_KEYS] = env.keys
        if env.tags:
            attributes[A.ROCKETMQ_TAG] = env.tags
        delivered = getattr(env, "delivered_topic", None)
        if delivered and delivered != topic:
            attributes[A.DELIVERED_TOPIC] = delivered
        return self.tracer.start_span(
            f"{A.OP_PROCESS} {topic}",
            kind=api.trace.SpanKind.CONSUMER,
            attributes=attributes,
            links=producer_link(env.properties),
        )

    def _current(self, env: Envelope) -> Any | None:
        with self._lock:
            queue = self._spans.get(id(env))
            return queue[0] if queue else None

    def _take(self, env: Envelope) -> Any | None:
        with self._lock:
            queue = self._spans.get(id(env))
            if not queue:
                return None
            span = queue.pop(0)
            if not queue:
                del self._spans[id(env)]
            return span

    # --- GuardHooks ---------------------------------------------------------------------------------
    def before_journal(self, envs: Sequence[Envelope]) -> None:
        started = [(id(env), self._start(env)) for env in envs]
        with self._lock:
            for key, span in started:
                self._spans.setdefault(key, []).append(span)

    def before_handler(self, env: Envelope) -> None:
        span = self._current(env)
        if span is not None:
            token = api.otel_context.attach(api.trace.set_span_in_context(span))
            with self._lock:
                self._tokens[id(env)] = token

    def after_handler(self, env: Envelope, error: BaseException | None) -> None:
        with self._lock:
            token = self._tokens.pop(id(env), None)
        if token is not None:
            api.otel_context.detach(token)
        span = self._current(env)
        if span is not None and error is not None:
            span.record_exception(error)

    def after_decision(self, env: Envelope, decision: Decision) -> None:
        span = self._take(env)
        if span is None:  # decided without a journal step: a zero-length span, but one per delivery
            span = self._start(env)
        span.set_attribute(A.OUTCOME, decision.outcome.value)
        span.set_attribute(A.REASON, decision.reason.value)
        span.set_attribute(A.RESULT, decision.result.value)
        span.set_attribute(A.DUPLICATE, decision.duplicate)
        if decision.result is ConsumeResult.DEAD_LETTER:
            detail = decision.detail or decision.reason.value
            span.set_status(api.trace.Status(api.trace.StatusCode.ERROR, detail))
        span.end()
