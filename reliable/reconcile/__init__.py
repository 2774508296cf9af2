"""The reconciliation report, per consumer group: stubs and inboxes vs deliveries vs offsets (DESIGN.md §4).

Layout, so each part can be used and tested alone:

* :mod:`.config` — the anomaly parameters and thresholds (plain dataclasses, no Spark);
* :mod:`.inputs` — the contract tables projected, typed and windowed;
* :mod:`.transforms` — pure DataFrame → DataFrame functions (no I/O), the (group, message) pairs and the
  definitions of *lost*, *stuck*, *duplicate*, *never consumed* and the rest;
* :mod:`.retry` — the sweeper's broker retry schedule as a Spark column (when a retried pair is stuck);
* :mod:`.orphans` — deliveries of messages that have no stub at all (their own join strategy);
* :mod:`.aggregates` — the small per-queue, per-group and overall results the driver collects;
* :mod:`.summary` — the stable ``summary.json`` dictionary built from the small aggregated results;
* :mod:`.report_html` — the self-contained ``report.html`` rendered from that dictionary (no Spark);
* :mod:`.io` — the SparkSession, JDBC / Parquet readers and the writers;
* :mod:`.runner` — the orchestration used by ``reliable reconcile`` and ``jobs/reconcile.py``.

Importing this package does not import PySpark: the core library must work without the ``[spark]`` extra.
"""

from __future__ import annotations

from reliable.reconcile.config import ReconcileConfig, Thresholds
from reliable.reconcile.errors import InputError, OptionError, ReconcileError, SparkUnavailableError

__all__ = [
    "InputError",
    "OptionError",
    "ReconcileConfig",
    "ReconcileError",
    "SparkUnavailableError",
    "Thresholds",
]
