"""The stub producer's Prometheus counters, on the process registry.

A module of their own, below :mod:`reliable.producer`: telemetry (:mod:`reliable.otel.metrics`) makes every
``reliable`` family exist before it mirrors them, and must not import the producer, which uses telemetry
(the sweeper's counters live in :mod:`reliable.sweeper.metrics` for the same reason).
"""

from __future__ import annotations

from prometheus_client import Counter

SENDS = Counter("reliable_producer_sends", "Staged messages the producer tried to send", ["outcome"])
HOOK_ERRORS = Counter("reliable_producer_hook_errors", "After-commit send batches that raised")
RECORD_FAILURES = Counter(
    "reliable_producer_record_failures",
    "Transactions recording send results that failed (retried, or given up and left to the sweeper)",
    ["outcome"],
)
