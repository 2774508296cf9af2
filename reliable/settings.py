"""Settings for :class:`reliable.Reliability`, from keyword arguments or ``RELIABLE_*`` environment variables.

Precedence: explicit argument > environment variable > default. Environment values are parsed with the
field's type so that ``RELIABLE_LEASE_MS=abc`` fails at start-up with a clear message instead of at the first
message.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from reliable import constants as C
from reliable.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class Settings:
    """Tunables of the consumer guard, the producer and the sweeper."""

    #: Redis lease length: a worker that dies mid-handler blocks its message this long.
    lease_ms: int = C.DEFAULT_LEASE_MS
    #: how long the ``done`` marker lets Redis answer "duplicate" without touching the database.
    done_ttl_s: int = C.DEFAULT_DONE_TTL_S
    #: deliveries of one message that may fail before the guard answers DEAD_LETTER.
    max_attempts: int = C.DEFAULT_MAX_ATTEMPTS
    key_prefix: str = C.DEFAULT_KEY_PREFIX
    redis_socket_timeout_s: float = C.DEFAULT_REDIS_SOCKET_TIMEOUT_S
    #: delay before the sweeper may first re-send a stub after a send.
    first_resend_delay_s: float = C.DEFAULT_FIRST_RESEND_DELAY_S
    max_sends: int = C.DEFAULT_MAX_SENDS
    stuck_after_s: float = C.DEFAULT_STUCK_AFTER_S
    log_retention_s: float = C.DEFAULT_LOG_RETENTION_S
    sweep_batch: int = C.DEFAULT_SWEEP_BATCH
    #: store a SHA-256 of each body and refuse a different body under the same id.
    check_payload: bool = True
    #: buffer the journal rows of duplicates Redis answers as ``done`` and write them in batches instead of
    #: one commit each (see :mod:`reliable.stores.behind` for exactly what a crash can lose). Off by default.
    journal_write_behind: bool = False
    #: write-behind: flush once this many rows are buffered …
    journal_flush_rows: int = 256
    #: … or this many milliseconds after the oldest buffered row, whichever comes first.
    journal_flush_ms: int = 200
    #: emit OpenTelemetry spans (producer, guard, sweeper); needs the ``otel`` extra. Off by default.
    otel: bool = False
    #: ``messaging.system`` of those spans (``rocketmq``, ``kafka``, ``rabbitmq``).
    otel_messaging_system: str = "rocketmq"

    @classmethod
    def load(
        cls, overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
    ) -> Settings:
        """Build settings from ``overrides`` (keyword arguments) and ``RELIABLE_<NAME>`` variables."""
        env = os.environ if environ is None else environ
        overrides = dict(overrides or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise ConfigurationError(f"unknown setting(s): {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for name, f in known.items():
            if name in overrides and overrides[name] is not None:
                values[name] = _coerce(name, overrides[name], f.type)
                continue
            raw = env.get(C.ENV_PREFIX + name.upper())
            if raw is not None and raw != "":
                values[name] = _coerce(name, raw, f.type)
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Reject values that would make the guard unsafe rather than merely slow."""
        for name in (
            "lease_ms",
            "done_ttl_s",
            "max_attempts",
            "max_sends",
            "sweep_batch",
            "journal_flush_rows",
            "journal_flush_ms",
        ):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"setting {name} must be > 0, got {getattr(self, name)!r}")
        for name in ("first_resend_delay_s", "stuck_after_s", "log_retention_s", "redis_socket_timeout_s"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"setting {name} must be >= 0, got {getattr(self, name)!r}")
        if not self.key_prefix or ":" in self.key_prefix:
            raise ConfigurationError("setting key_prefix must be non-empty and contain no ':'")

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied and validated."""
        new = dataclasses.replace(self, **changes)
        new.validate()
        return new


def _coerce(name: str, value: Any, type_name: Any) -> Any:
    """Parse ``value`` as the field's declared type (annotations are strings under ``from __future__``)."""
    t = str(type_name)
    try:
        if t == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in {"1", "true", "yes", "on"}:
                return True
            if text in {"0", "false", "no", "off"}:
                return False
            raise ValueError(value)
        if t == "int":
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if t == "float":
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"setting {name}: cannot read {value!r} as {t}") from None
