"""The guard's Prometheus counters read the same through OpenTelemetry, fresh work apart from replays."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.otel import mirror_prometheus
from tests.core.guard_helpers import apply, env, make_rel


@pytest.fixture
def rel(sqlite_url: str, key_prefix: str) -> Iterator[Reliability]:
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    r = make_rel(sqlite_url, None, key_prefix)
    yield r
    r.close()


def points(reader: InMemoryMetricReader, name: str) -> dict[tuple[tuple[str, Any], ...], float]:
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[tuple[tuple[str, Any], ...], float] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    for p in metric.data.data_points:
                        assert isinstance(p, NumberDataPoint) and p.attributes is not None  # counters
                        out[tuple(sorted(p.attributes.items()))] = p.value
    return out


def test_messages_and_duplicates_are_exported_with_outcome_and_source(rel: Reliability) -> None:
    registry = CollectorRegistry()
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")

    @idempotent_consumer(rel, group="billing", registry=registry)
    def handle(e: Envelope, session: Session) -> None:
        apply(e, session)

    names = mirror_prometheus(registry, meter)
    assert {"reliable.messages", "reliable.duplicates_suppressed", "reliable.redis_fallbacks"} <= set(names)
    assert mirror_prometheus(registry, meter) == [], "a second install must not register twice"
    fresh = [f"m-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    for mid in fresh:
        handle(env(mid))
    handle(env(fresh[0]))  # one replay
    messages = points(reader, "reliable.messages")
    success = (("group", "billing"), ("outcome", "SUCCESS"), ("reason", "processed"))
    replay = (("group", "billing"), ("outcome", "DUPLICATE"), ("reason", "duplicate_confirmed"))
    assert (messages[success], messages[replay]) == (3, 1)
    assert points(reader, "reliable.duplicates_suppressed") == {
        (("group", "billing"), ("source", "database")): 1
    }


def test_with_telemetry_on_the_first_guard_mirrors_the_process_counters(
    sqlite_url: str, key_prefix: str, global_metrics: InMemoryMetricReader
) -> None:
    """No set-up call: turning telemetry on is enough for the counters to reach the OTel meter provider."""
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    group = f"g{uuid.uuid4().hex[:8]}"
    rel = make_rel(sqlite_url, None, key_prefix, otel=True)
    try:

        @idempotent_consumer(rel, group=group)  # the process registry, as in production
        def handle(e: Envelope, session: Session) -> None:
            apply(e, session)

        mid = f"m-{uuid.uuid4().hex[:6]}"
        handle(env(mid))
        handle(env(mid))
    finally:
        rel.close()
    messages = points(global_metrics, "reliable.messages")
    mine = {dict(k)["outcome"]: v for k, v in messages.items() if dict(k)["group"] == group}
    assert mine == {"SUCCESS": 1, "DUPLICATE": 1}
    assert "reliable.sweeper_resent" in {m for m in names(global_metrics)}, "the sweeper's counters too"


def names(reader: InMemoryMetricReader) -> set[str]:
    data = reader.get_metrics_data()
    assert data is not None
    return {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
