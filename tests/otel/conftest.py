"""One SDK tracer and meter provider for the process (OpenTelemetry allows setting each once).

The spans are emptied per test; the metric reader is cumulative, so metric tests look at their own
(uniquely named) consumer group. The SDK is in the dev extra: these tests never skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER = InMemorySpanExporter()
_READER = InMemoryMetricReader()


@pytest.fixture(scope="session")
def _provider() -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))
    return provider


@pytest.fixture
def spans(_provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


@pytest.fixture
def global_metrics(_provider: TracerProvider) -> InMemoryMetricReader:
    """The reader of the process-wide meter provider (what an application's exporter would read)."""
    return _READER
