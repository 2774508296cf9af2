"""The one guarded import of the OpenTelemetry API, and the switch that turns tracing on.

Why a separate module: ``opentelemetry-api`` is an optional extra (``reliable[otel]``). Every other
module of :mod:`reliable.otel` imports the API only through here, so a process without it pays one failed
import at start-up and afterwards a single ``is None`` test per call site — never a per-message import or
exception. Tracing is also off unless the setting ``otel`` (env ``RELIABLE_OTEL=1``) is set, because spans
cost time per delivery and most deployments have no collector.
"""

from __future__ import annotations

from typing import Any

from reliable.errors import ConfigurationError

try:  # pragma: no cover - exercised by both the with- and the without-extra installs
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import propagate, trace

    AVAILABLE = True
except ImportError:  # the extra is not installed: every entry point below answers "off"
    otel_context = otel_metrics = propagate = trace = None  # type: ignore[assignment]
    AVAILABLE = False

__all__ = ["AVAILABLE", "enabled", "otel_context", "otel_metrics", "propagate", "trace"]

#: instrumentation scope name of every tracer and meter of `reliable`
SCOPE = "reliable"


def enabled(rel: Any) -> bool:
    """Whether ``rel`` (a :class:`reliable.Reliability`) asked for telemetry; raises if it cannot have it."""
    if not getattr(rel.settings, "otel", False):
        return False
    if not AVAILABLE:
        raise ConfigurationError(
            "setting otel is on but the OpenTelemetry API is not installed (pip install 'reliable[otel]')"
        )
    return True


def tracer() -> Any:
    """The `reliable` tracer of the global provider (a proxy until the application installs its provider)."""
    return trace.get_tracer(SCOPE)


def meter() -> Any:
    """The `reliable` meter of the global meter provider (a proxy until the application installs one)."""
    return otel_metrics.get_meter(SCOPE)
