"""The trace context really travels through a broker: producer → broker_sim (in-process) → push consumer
threads → guard. Each delivery's ``process`` span links to its own message's ``create`` span."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util.types import AnyValue
from prometheus_client import CollectorRegistry

from reliable import Reliability, StubProducer, idempotent_consumer
from reliable.adapters.broker_sim import BrokerSimSender, GuardedListener, send_back_to_dlq
from reliable.demo import ledger
from tests.sweeper.helpers import clean
from tests.waiting import wait_until

TOPIC, GROUP = "TracedOrders", "traced_g"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Any]:
    from broker_sim.broker.broker import Broker

    b = Broker(str(tmp_path / "store"), topics={TOPIC: 4}, commit_log_file_size=8 << 20)
    b.start()
    yield b
    b.shutdown()


def attrs(span: ReadableSpan) -> Mapping[str, AnyValue]:
    """A finished span's attributes (the SDK gives every span a mapping, empty or not)."""
    assert span.attributes is not None
    return span.attributes


def test_each_delivery_links_to_its_own_producer_span(
    sqlite_url: str, broker: Any, spans: InMemorySpanExporter
) -> None:
    from broker_sim.broker.api import ConsumeFromWhere
    from broker_sim.client.producer import Producer
    from broker_sim.client.push_consumer import PushConsumer
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    rel = Reliability(sqlite_url, None, otel=True, otel_messaging_system="rocketmq")
    clean(rel.engine)
    ledger.reset(rel.engine, 10)
    producer = Producer(broker, "traced_p")
    orders = ledger.make_orders("t", 20, 10, seed=5)
    with StubProducer(rel, BrokerSimSender(producer), default_group=GROUP).transaction() as tx:
        for o in orders:
            tx.stage(o.order_id, TOPIC, o.to_body())
    creates = {
        attrs(s)["messaging.message.id"]: s for s in spans.get_finished_spans() if s.name.startswith("create")
    }
    assert len(creates) == 20

    handler = idempotent_consumer(rel, group=GROUP, registry=CollectorRegistry())(
        ledger.make_business_handler("t")
    )
    consumer = PushConsumer(
        broker,
        GROUP,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_message_batch_max_size=4,
    )
    listener = GuardedListener(handler, send_back_to_dlq(consumer.transport, GROUP))
    consumer.subscribe(TOPIC, "*", listener)
    consumer.start()
    try:
        wait_until(
            lambda: sum(s.name == f"process {TOPIC}" for s in spans.get_finished_spans()) >= 20,
            what="20 deliveries processed",
        )
    finally:
        consumer.shutdown()
        producer.shutdown()
        rel.close()
    process = [s for s in spans.get_finished_spans() if s.name == f"process {TOPIC}"]
    for span in process:
        mid = attrs(span)["messaging.message.id"]
        assert [link.context.span_id for link in span.links] == [creates[mid].context.span_id], mid
        assert attrs(span)["messaging.consumer.group.name"] == GROUP
    assert {attrs(s)["reliable.reason"] for s in process} <= {"processed", "duplicate_confirmed"}
    assert sum(attrs(s)["reliable.reason"] == "processed" for s in process) == 20
