"""The reconciliation report: stubs vs deliveries vs consumer offsets (DESIGN.md §4).

Layout, so each part can be used and tested alone:

* :mod:`.config` — the anomaly parameters and thresholds (plain dataclasses, no Spark);
* :mod:`.transforms` — pure DataFrame → DataFrame functions (no I/O), the definitions of *lost*, *stuck*,
  *duplicate* and the rest;
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
