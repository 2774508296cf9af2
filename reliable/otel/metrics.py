"""The Prometheus counters of `reliable`, mirrored as OpenTelemetry metrics.

Why a mirror and not a second set of counters: the guard, producer and sweeper count once, on their
Prometheus registry, on their hot paths; an OTel pipeline (OTLP to a collector) reads the very same numbers
through observable instruments whose callbacks run only when the meter's reader exports. Nothing is counted
twice, nothing costs anything per message, and the two views can never disagree.

Names: ``reliable_messages`` (Prometheus) → ``reliable.messages`` (OTel), labels → attributes. Fresh work and
replayed duplicates are told apart by the ``outcome`` attribute of ``reliable.messages`` (``SUCCESS`` versus
``DUPLICATE``) and counted by where they were caught in ``reliable.duplicates_suppressed``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from reliable.otel import api

_PREFIX = "reliable_"
_lock = threading.Lock()
_installed: set[tuple[int, int]] = set()


def otel_name(prometheus_name: str) -> str:
    """``reliable_sweeper_resent`` → ``reliable.sweeper_resent``."""
    return "reliable." + prometheus_name[len(_PREFIX) :]


def _families(registry: CollectorRegistry) -> dict[str, tuple[str, str]]:
    """``name → (type, help)`` of every `reliable` counter and gauge registered now."""
    return {
        m.name: (m.type, m.documentation)
        for m in registry.collect()
        if m.name.startswith(_PREFIX) and m.type in ("counter", "gauge")
    }


def _observer(registry: CollectorRegistry, name: str, kind: str) -> Any:
    sample_name = name + "_total" if kind == "counter" else name

    def observe(_options: Any) -> Iterable[Any]:
        for family in registry.collect():
            if family.name != name:
                continue
            for sample in family.samples:
                if sample.name == sample_name:
                    yield api.otel_metrics.Observation(sample.value, dict(sample.labels))

    return observe


def _register_known(registry: CollectorRegistry) -> None:
    """Make every `reliable` family exist on ``registry`` before mirroring (they register lazily)."""
    from reliable.metrics import guard_metrics

    guard_metrics(registry)
    if registry is REGISTRY:  # the producer's and the sweeper's counters live on the process registry
        import reliable.producer_metrics
        import reliable.sweeper.metrics  # noqa: F401


def mirror_prometheus(registry: CollectorRegistry | None = None, meter: Any | None = None) -> list[str]:
    """Expose every `reliable` counter/gauge of ``registry`` through ``meter``; returns the OTel names.

    Idempotent per (registry, meter). The defaults are the process registry and the global meter provider
    (a proxy until the application installs its provider); with telemetry on, the first guard, producer or
    sweeper calls it so. A test or an application with its own registry calls it with that registry.
    """
    reg = REGISTRY if registry is None else registry
    with _lock:
        key = (id(reg), 0 if meter is None else id(meter))
        if key in _installed:
            return []
        _installed.add(key)
    _register_known(reg)
    m = api.meter() if meter is None else meter
    names = []
    for name, (kind, help_text) in sorted(_families(reg).items()):
        callbacks = [_observer(reg, name, kind)]
        if kind == "counter":
            m.create_observable_counter(otel_name(name), callbacks=callbacks, description=help_text)
        else:
            m.create_observable_gauge(otel_name(name), callbacks=callbacks, description=help_text)
        names.append(otel_name(name))
    return names
