"""Per consumer group settings that 5.x moves to the server: retry policy and FIFO.

A 5.x consumer learns its group's retry policy (max attempts + backoff) and whether the group is FIFO from
the Telemetry *settings* reply, and the broker applies the same max attempts when it redelivers (past it,
the message goes to ``%DLQ%{group}``). Groups without an explicit policy get RocketMQ's defaults: 17
delivery attempts (the 4.x group's ``retryMaxTimes`` 16 + the first delivery) and the 4.x delay levels
from level 3 (10 s, 30 s, 1 m, …) as customized backoff.

Policies are set with ``broker-sim serve --grpc-group 'NAME:fifo,max_attempts=3,backoff=1s;5s'`` or in
process through :meth:`GroupPolicies.set`, and persisted in ``config/grpcGroupPolicy.json``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_sim.common.json_file import read_json, write_json_atomic

DEFAULT_MAX_ATTEMPTS = 17
DEFAULT_BACKOFF_S: tuple[float, ...] = (10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800,
                                        3600, 7200)  # fmt: skip
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_seconds(text: str) -> float:
    """``"500ms"``, ``"5s"``, ``"2m"``, ``"1h"`` or a plain number of seconds."""
    text = text.strip()
    for unit in ("ms", "s", "m", "h"):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            return float(text[: -len(unit)]) * _UNITS[unit]
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 500ms, 5s, 2m)") from None


@dataclass(frozen=True)
class GroupPolicy:
    fifo: bool = False
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    #: customized backoff: delay before attempt n+1 is ``backoff_s[min(n, len) - 1]``
    backoff_s: tuple[float, ...] = field(default=DEFAULT_BACKOFF_S)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not self.backoff_s or any(b < 0 for b in self.backoff_s):
            raise ValueError("backoff needs at least one non-negative duration")

    def delay_s(self, attempt: int) -> float:
        """The backoff after the ``attempt``-th delivery failed (1-based)."""
        return self.backoff_s[min(max(attempt, 1), len(self.backoff_s)) - 1]

    def to_json(self) -> dict[str, Any]:
        return {"fifo": self.fifo, "maxAttempts": self.max_attempts, "backoffSeconds": list(self.backoff_s)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GroupPolicy:
        return cls(bool(d["fifo"]), int(d["maxAttempts"]), tuple(float(x) for x in d["backoffSeconds"]))

    @classmethod
    def parse(cls, spec: str) -> tuple[str, GroupPolicy]:
        """``NAME:fifo,max_attempts=3,backoff=1s;5s`` → (NAME, policy); ValueError with the reason."""
        name, sep, options = spec.partition(":")
        if not name.strip():
            raise ValueError(f"--grpc-group expects NAME:OPTIONS, got {spec!r}")
        fifo, attempts, backoff = False, DEFAULT_MAX_ATTEMPTS, DEFAULT_BACKOFF_S
        for item in filter(None, (o.strip() for o in options.split(","))) if sep else ():
            key, _, value = item.partition("=")
            if key == "fifo" and not value:
                fifo = True
            elif key == "max_attempts":
                if not value.strip().isdigit():
                    raise ValueError(
                        f"--grpc-group {spec!r}: max_attempts must be a whole number, got {value!r}"
                    )
                attempts = int(value)
            elif key == "backoff":
                backoff = tuple(parse_seconds(v) for v in value.split(";") if v)
            else:
                raise ValueError(
                    f"unknown --grpc-group option {item!r} (fifo, max_attempts=N, backoff=1s;5s)"
                )
        return name.strip(), cls(fifo, attempts, backoff)


class GroupPolicies:
    """The table of explicit policies; :meth:`get` falls back to the defaults."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._table: dict[str, GroupPolicy] = {}

    def load(self) -> None:
        raw = read_json(self.path)
        if raw is not None:
            with self._lock:
                self._table = {k: GroupPolicy.from_json(v) for k, v in raw.items()}

    def get(self, group: str) -> GroupPolicy:
        with self._lock:
            return self._table.get(group) or GroupPolicy()

    def set(self, group: str, policy: GroupPolicy) -> None:
        with self._lock:
            self._table[group] = policy
            snapshot = {k: v.to_json() for k, v in self._table.items()}
        write_json_atomic(self.path, snapshot)
