"""Prometheus counters and the structured decision log line of the consumer guard.

Counters live on a :class:`prometheus_client.CollectorRegistry`; :func:`guard_metrics` returns one
:class:`GuardMetrics` per registry (prometheus refuses to register a name twice), so every guard in a process
shares the default registry while a test passes its own and sees only its own numbers.

Every decision also produces one log record on the ``reliable.guard`` logger, with the fields both in the
message (``key=value``, greppable) and as ``extra`` attributes (for a JSON formatter)::

    decision message_id=m-1 group=g outcome=DUPLICATE result=SUCCESS reason=duplicate_done_marker duplicate=1
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from reliable import constants as C
from reliable.guard.decision import Decision, Reason
from reliable.types import ConsumeResult

#: where a suppressed duplicate was recognised (label ``source``)
_DUPLICATE_SOURCE = {Reason.DUPLICATE_DONE_MARKER: "redis", Reason.DUPLICATE_IN_BATCH: "batch"}

log = logging.getLogger(C.GUARD_LOGGER)


@dataclass(frozen=True)
class GuardMetrics:
    """The guard's counters (all labelled by consumer group)."""

    messages: Counter
    duplicates: Counter
    redis_fallbacks: Counter
    lease_conflicts: Counter
    handler_failures: Counter
    database_errors: Counter


_lock = threading.Lock()
_by_registry: dict[int, tuple[CollectorRegistry, GuardMetrics]] = {}


def guard_metrics(registry: CollectorRegistry | None = None) -> GuardMetrics:
    """The guard counters registered on ``registry`` (default: the process-wide registry)."""
    reg = REGISTRY if registry is None else registry
    with _lock:
        hit = _by_registry.get(id(reg))
        if hit is not None and hit[0] is reg:
            return hit[1]
        m = GuardMetrics(
            messages=Counter(
                "reliable_messages",
                "Deliveries decided by the guard, by journal outcome and reason",
                ["group", "outcome", "reason"],
                registry=reg,
            ),
            duplicates=Counter(
                "reliable_duplicates_suppressed",
                "Duplicate deliveries acknowledged without running the handler, by where they were caught",
                ["group", "source"],
                registry=reg,
            ),
            redis_fallbacks=Counter(
                "reliable_redis_fallbacks",
                "Redis calls that failed (or were skipped after a failure): the database decided alone",
                ["operation"],
                registry=reg,
            ),
            lease_conflicts=Counter(
                "reliable_lease_conflicts",
                "Deliveries sent back because another worker held a live lease on the message",
                ["group"],
                registry=reg,
            ),
            handler_failures=Counter(
                "reliable_handler_failures",
                "Handler exceptions (the transaction was rolled back)",
                ["group"],
                registry=reg,
            ),
            database_errors=Counter(
                "reliable_database_errors",
                "Database errors in the guard's own statements, by step",
                ["group", "step"],
                registry=reg,
            ),
        )
        _by_registry[id(reg)] = (reg, m)
        return m


class DecisionObserver:
    """Counts and logs one guard's decisions (label children cached: ``labels()`` is not free per message)."""

    def __init__(self, metrics: GuardMetrics, group: str) -> None:
        self.metrics = metrics
        self.group = group
        self._children: dict[Reason, Any] = {}

    def __call__(self, d: Decision) -> None:
        child = self._children.get(d.reason)
        if child is None:
            child = self._children[d.reason] = self.metrics.messages.labels(
                self.group, d.outcome.value, d.reason.value
            )
        child.inc()
        if d.duplicate:
            source = {"duplicate_done_marker": "redis", "duplicate_in_batch": "batch"}.get(
                d.reason.value, "database"
            )
            self.metrics.duplicates.labels(self.group, source).inc()
        elif d.reason.value == "lease_conflict":
            self.metrics.lease_conflicts.labels(self.group).inc()
        log_decision(
            message_id=d.message_id,
            group=self.group,
            outcome=d.outcome.value,
            result=d.result.value,
            reason=d.reason.value,
            duplicate=d.duplicate,
            detail=d.detail,
            level=logging.ERROR if d.result is ConsumeResult.DEAD_LETTER else logging.INFO,
        )


def log_decision(
    *,
    message_id: str | None,
    group: str,
    outcome: str,
    result: str,
    reason: str,
    duplicate: bool,
    detail: str | None,
    level: int = logging.INFO,
) -> None:
    """One structured line per decision (skipped cheaply when the level is disabled)."""
    if not log.isEnabledFor(level):
        return
    log.log(
        level,
        "decision message_id=%s group=%s outcome=%s result=%s reason=%s duplicate=%d%s",
        message_id,
        group,
        outcome,
        result,
        reason,
        int(duplicate),
        f" detail={detail!r}" if detail else "",
        extra={
            "message_id": message_id,
            "group": group,
            "outcome": outcome,
            "result": result,
            "reason": reason,
            "duplicate": duplicate,
            "detail": detail,
        },
    )
