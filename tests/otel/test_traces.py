"""A message can be followed from the producer's transaction through the sweeper into the handler.

What a user with a tracing backend needs: every delivery is one ``process`` span with the messaging
attributes and the guard's verdict, linked to the span that created the message — also when the message
arrives through a resend hours later from another process — and a replayed duplicate is told apart from
fresh work at a glance.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from sqlalchemy import select
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, StubProducer, idempotent_consumer
from reliable.models import MessageStub
from reliable.sender import OutgoingMessage
from reliable.sweeper import Sweeper
from reliable.types import ConsumeResult
from tests.core.guard_helpers import apply, make_rel
from tests.sweeper.helpers import Clock, QueueSender, clean

CONSUMER = trace.SpanKind.CONSUMER


@pytest.fixture
def rel(sqlite_url: str, key_prefix: str) -> Iterator[Reliability]:
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    r = make_rel(sqlite_url, None, key_prefix, otel=True, first_resend_delay_s=60)
    clean(r.engine)
    yield r
    r.close()


def delivered(message: OutgoingMessage, offset: int = 1, reconsume_times: int = 0) -> Envelope:
    """What an adapter hands the guard: the properties the producer sent travel with the message."""
    return Envelope(
        message_id=message.message_id,
        topic=message.topic,
        queue_id=0,
        queue_offset=offset,
        body=message.body,
        reconsume_times=reconsume_times,
        properties=dict(message.properties),
    )


def named(spans: InMemorySpanExporter, name: str) -> list[Any]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def test_delivery_span_links_to_the_producer_and_tells_duplicates_from_fresh_work(
    rel: Reliability, spans: InMemorySpanExporter
) -> None:
    sender = QueueSender(queues=1)
    producer = StubProducer(rel, sender, default_group="billing")
    tracer = trace.get_tracer("test")
    mid = f"o-{uuid.uuid4().hex[:8]}"
    with tracer.start_as_current_span("POST /orders") as request:
        producer.publish(mid, "orders", b'{"order":1}')
    (create,) = named(spans, "create orders")
    (send,) = named(spans, "send orders")
    assert create.parent is not None and create.parent.span_id == request.get_span_context().span_id
    assert create.kind is trace.SpanKind.PRODUCER and create.attributes["messaging.message.id"] == mid
    assert [link.context.span_id for link in send.links] == [create.context.span_id]
    (message,) = sender.sent
    assert "traceparent" in message.properties

    inner: list[Any] = []

    @idempotent_consumer(rel, group="billing", registry=CollectorRegistry())
    def handle(env: Envelope, session: Session) -> None:
        with tracer.start_as_current_span("apply payment") as span:
            inner.append(span)
        apply(env, session)

    assert handle(delivered(message)) is ConsumeResult.SUCCESS
    assert handle(delivered(message, offset=2, reconsume_times=1)) is ConsumeResult.SUCCESS
    fresh, replay = named(spans, "process orders")
    for span in (fresh, replay):
        assert span.kind is CONSUMER
        assert [link.context.span_id for link in span.links] == [create.context.span_id]
        assert [link.context.trace_id for link in span.links] == [request.get_span_context().trace_id]
        a = span.attributes
        assert (a["messaging.system"], a["messaging.operation.name"], a["messaging.operation.type"]) == (
            "rocketmq",
            "process",
            "process",
        )
        assert (a["messaging.destination.name"], a["messaging.consumer.group.name"]) == ("orders", "billing")
        assert a["messaging.message.id"] == mid
    assert (fresh.attributes["reliable.outcome"], fresh.attributes["reliable.duplicate"]) == (
        "SUCCESS",
        False,
    )
    assert fresh.attributes["reliable.reason"] == "processed"
    assert (replay.attributes["reliable.outcome"], replay.attributes["reliable.duplicate"]) == (
        "DUPLICATE",
        True,
    )
    assert replay.attributes["reliable.reason"] == "duplicate_confirmed"
    assert replay.attributes["reliable.reconsume_times"] == 1
    # the handler's own span is a child of the delivery's span, and only fresh work ran the handler
    (apply_span,) = named(spans, "apply payment")
    assert apply_span.parent is not None and apply_span.parent.span_id == fresh.context.span_id


def test_dead_letter_is_an_error_span_with_the_reason(rel: Reliability, spans: InMemorySpanExporter) -> None:
    @idempotent_consumer(rel, group="billing", registry=CollectorRegistry())
    def handle(env: Envelope, session: Session) -> None:
        apply(env, session)

    bad = Envelope(message_id=None, topic="orders", queue_id=3, queue_offset=9, body=b"{}")
    assert handle.batch([bad]) == [ConsumeResult.DEAD_LETTER]
    (span,) = named(spans, "process orders")
    assert span.status.status_code is trace.StatusCode.ERROR
    assert span.attributes["reliable.reason"] == "missing_message_id"
    assert span.attributes["messaging.destination.partition.id"] == "3"
    assert "messaging.message.id" not in span.attributes and span.links == ()


def test_sweeper_resend_carries_the_stored_context(rel: Reliability, spans: InMemorySpanExporter) -> None:
    clock = Clock()
    sender = QueueSender(queues=1)
    sender.fail_next = 1  # the producer's own send fails: only the sweeper can deliver it
    producer = StubProducer(rel, sender, default_group="billing", clock=clock)
    mid = f"o-{uuid.uuid4().hex[:8]}"
    producer.publish(mid, "orders", b"{}")
    (create,) = named(spans, "create orders")
    with rel.session() as s:
        stored = s.execute(select(MessageStub.trace_context).where(MessageStub.message_id == mid)).scalar()
    assert stored is not None and create.context.trace_id.to_bytes(16, "big").hex() in stored
    spans.clear()

    sweeper = Sweeper(rel, sender, clock=clock)
    clock.advance(120)
    assert sweeper.run_once().resent == 1
    (resend,) = sender.sent
    assert resend.properties["RELIABLE_RESEND"] == "1"
    (round_span,) = named(spans, "reliable.sweep")
    (send,) = named(spans, "send orders")
    assert send.parent is not None and send.parent.span_id == round_span.context.span_id
    assert send.attributes["reliable.resend"] is True and send.attributes["reliable.send_count"] == 1
    assert [link.context.span_id for link in send.links] == [create.context.span_id]
    assert round_span.attributes["reliable.sweep.resent"] == 1

    @idempotent_consumer(rel, group="billing", registry=CollectorRegistry())
    def handle(env: Envelope, session: Session) -> None:
        apply(env, session)

    assert handle(delivered(resend)) is ConsumeResult.SUCCESS
    (process,) = named(spans, "process orders")
    assert [link.context.span_id for link in process.links] == [create.context.span_id]


def test_off_by_default_nothing_is_emitted_or_stored(
    sqlite_url: str, key_prefix: str, spans: InMemorySpanExporter
) -> None:
    rel = make_rel(sqlite_url, None, key_prefix)
    try:
        clean(rel.engine)
        sender = QueueSender(queues=1)
        mid = f"o-{uuid.uuid4().hex[:8]}"
        StubProducer(rel, sender, default_group="billing").publish(mid, "orders", b"{}")

        @idempotent_consumer(rel, group="billing", registry=CollectorRegistry())
        def handle(env: Envelope, session: Session) -> None:
            apply(env, session)

        assert handle(delivered(sender.sent[0])) is ConsumeResult.SUCCESS
        assert handle.guard.hooks == ()
        assert sender.sent[0].properties == {}
        with rel.session() as s:
            assert s.execute(select(MessageStub.trace_context)).scalar() is None
        assert spans.get_finished_spans() == ()
    finally:
        rel.close()


@pytest.mark.redis
def test_every_delivery_of_a_batch_gets_one_span_also_those_redis_answers(
    sqlite_url: str, redis_url: str, key_prefix: str, spans: InMemorySpanExporter
) -> None:
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    rel = make_rel(sqlite_url, redis_url, key_prefix, otel=True, journal_write_behind=True)
    try:

        @idempotent_consumer(rel, group="billing", registry=CollectorRegistry())
        def handle(env: Envelope, session: Session) -> None:
            apply(env, session)

        ids = [f"b-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
        first = [Envelope(m, "orders", 0, i, b"{}") for i, m in enumerate(ids)]
        assert handle.batch([*first, Envelope(ids[0], "orders", 0, 9, b"{}")]) == [ConsumeResult.SUCCESS] * 4
        # the second time Redis answers from its done markers and the journal rows wait in the buffer
        again = [Envelope(m, "orders", 1, i, b"{}") for i, m in enumerate(ids)]
        assert handle.batch(again) == [ConsumeResult.SUCCESS] * 3
        handle.close()
        process = named(spans, "process orders")
        reasons = sorted(s.attributes["reliable.reason"] for s in process)
        assert reasons == sorted(
            ["processed"] * 3 + ["duplicate_in_batch"] + ["duplicate_done_marker"] * 3
        ), "one span per delivery, twins and write-behind duplicates included"
        assert sum(s.attributes["reliable.duplicate"] for s in process) == 4
    finally:
        rel.close()


def test_without_the_api_installed_reliable_imports_and_runs_untraced(tmp_path: Path) -> None:
    code = """
import sys
sys.modules["opentelemetry"] = None  # as if the extra were not installed
from reliable import Reliability, StubProducer
from reliable.errors import ConfigurationError
from reliable.otel import api
assert not api.AVAILABLE
from tests.sweeper.helpers import QueueSender
rel = Reliability(sys.argv[1]); rel.create_schema()
sender = QueueSender(queues=1)
StubProducer(rel, sender, default_group="g").publish("m-1", "orders", b"{}")
assert sender.sent[0].properties == {}
try:
    StubProducer(Reliability(sys.argv[1], otel=True), sender, default_group="g")
except ConfigurationError as exc:
    print("refused:", exc)
"""
    out = subprocess.run(
        [sys.executable, "-c", code, f"sqlite:///{tmp_path / 'x.db'}"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "refused: setting otel is on but the OpenTelemetry API is not installed" in out.stdout
