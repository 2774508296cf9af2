"""Settings for :class:`reliable.Reliability`, from keyword arguments or ``RELIABLE_*`` environment variables.

Precedence: explicit argument > environment variable > default. Environment values are parsed with the
field's type so that ``RELIABLE_LEASE_MS=abc`` fails at start-up with a clear message instead of at the first
message.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from reliable import constants as C
from reliable.durations import parse_seconds
from reliable.errors import ConfigurationError
from reliable.names import NAME_CHARS, check_group, is_name


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
    #: retention purge: rows per delete transaction, and the share of time it may work (0 < duty <= 1).
    purge_batch: int = C.DEFAULT_PURGE_BATCH
    purge_duty_cycle: float = C.DEFAULT_PURGE_DUTY_CYCLE
    #: a group's watermark still for this long with messages waiting beyond it: the stalled-group alarm.
    stall_after_s: float = C.DEFAULT_STALL_AFTER_S
    #: store a SHA-256 of each body and refuse a different body under the same id.
    check_payload: bool = True
    #: buffer the journal rows of duplicates Redis answers as ``done`` and write them in batches instead of
    #: one commit each (see :mod:`reliable.stores.behind` for exactly what a crash can lose). ``None`` (the
    #: default): on for ``def`` handlers, off for ``async def`` ones (their guard has no flush thread).
    journal_write_behind: bool | None = None
    #: write-behind: flush once this many rows are buffered …
    journal_flush_rows: int = 256
    #: … or this many milliseconds after the oldest buffered row, whichever comes first.
    journal_flush_ms: int = 200
    #: the consumer groups that subscribe to each topic: the producer stages one inbox row per group when the
    #: caller names none. Environment: ``RELIABLE_TOPIC_GROUPS="orders=billing,audit;payments=ledger"``.
    topic_groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: the group of a topic missing from ``topic_groups`` (empty: none; the producer then needs ``groups=``).
    default_group: str = ""

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
        for each in fields(self):
            value = getattr(self, each.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigurationError(f"setting {each.name} must be a finite number, got {value!r}")
        for name in (
            "lease_ms",
            "done_ttl_s",
            "max_attempts",
            "max_sends",
            "sweep_batch",
            "purge_batch",
            "stall_after_s",
            "journal_flush_rows",
            "journal_flush_ms",
            "redis_socket_timeout_s",  # 0 is "no timeout" to redis-py: a hung Redis would hang the guard
        ):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"setting {name} must be > 0, got {getattr(self, name)!r}")
        for name in ("first_resend_delay_s", "stuck_after_s", "log_retention_s"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"setting {name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 < self.purge_duty_cycle <= 1:
            raise ConfigurationError(
                f"setting purge_duty_cycle must be in (0, 1], got {self.purge_duty_cycle!r} (1: no rest)"
            )
        if not self.key_prefix or ":" in self.key_prefix:
            raise ConfigurationError("setting key_prefix must be non-empty and contain no ':'")
        # one rule with the producer and the guard (reliable.names): a group the guard accepts — RocketMQ's
        # ``%``/``|`` included — is one the settings accept, and ':' (shared Redis keys) is refused by all
        for name in (self.default_group, *(g for gs in self.topic_groups.values() for g in gs)):
            if name:
                check_group(name)
        for topic, groups in self.topic_groups.items():
            if not is_name(topic, C.TOPIC_MAX):
                raise ConfigurationError(
                    f"setting topic_groups: topic {topic!r}: 1..{C.TOPIC_MAX} characters, only {NAME_CHARS}"
                )
            if not groups or len(set(groups)) != len(groups):
                raise ConfigurationError(f"setting topic_groups: topic {topic!r} needs distinct groups")

    def groups_for(self, topic: str) -> tuple[str, ...]:
        """The groups expected to process a message of ``topic``: its subscribers, else the default group."""
        groups = self.topic_groups.get(topic)
        if groups:
            return groups
        return (self.default_group,) if self.default_group else ()

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied and validated."""
        new = dataclasses.replace(self, **changes)
        new.validate()
        return new


def parse_topic_groups(value: str | Mapping[str, Iterable[str]]) -> dict[str, tuple[str, ...]]:
    """``"orders=billing,audit;payments=ledger"`` (or a mapping) → ``{"orders": ("billing", "audit"), …}``."""
    if isinstance(value, Mapping):
        items = [(str(t), [str(g) for g in gs]) for t, gs in value.items()]
    else:
        items = []
        for part in filter(None, (p.strip() for p in str(value).split(";"))):
            topic, sep, groups = part.partition("=")
            if not sep:
                raise ValueError(f"{part!r} has no '='")
            items.append((topic.strip(), [g.strip() for g in groups.split(",") if g.strip()]))
    topics = [topic for topic, _ in items]
    repeated = sorted({t for t in topics if topics.count(t) > 1})
    if repeated:  # the last would win, and losses for the earlier entries' groups go undetected
        raise ValueError(f"topic {repeated[0]!r} is named twice; list all its groups once")
    return {topic: tuple(groups) for topic, groups in items}


def _coerce(name: str, value: Any, type_name: Any) -> Any:
    """Parse ``value`` as the field's declared type (annotations are strings under ``from __future__``)."""
    t = str(type_name)
    if name == "topic_groups":
        try:
            return parse_topic_groups(value)
        except ValueError as exc:
            raise ConfigurationError(
                f"setting topic_groups: cannot read {value!r} ({exc}); "
                "write 'orders=billing,audit;payments=ledger'"
            ) from None
    if name.endswith("_s") and t in {"int", "float"} and isinstance(value, str):
        # a duration field reads what the CLI's options read (RELIABLE_LOG_RETENTION_S=30d) and, as before,
        # any number Python reads (.5, 1e3)
        try:
            seconds = float(value)
        except ValueError:
            try:
                seconds = parse_seconds(value)
            except ValueError as exc:
                raise ConfigurationError(f"setting {name}: {exc}") from None
        if t == "float":
            return seconds  # nan and inf are refused by validate(), with the others
        if not math.isfinite(seconds) or seconds != int(seconds):
            raise ConfigurationError(f"setting {name}: {value!r} is not a whole number of seconds")
        return int(seconds)
    if t == "bool | None":
        if value is None:
            return None
        t = "bool"
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
