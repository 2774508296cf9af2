"""Faults of the reconciliation job.

Finding lost or duplicated messages is the job's *result*, not an error: those are counts in the summary and
crossed thresholds are an exit code. Exceptions here are for input the job cannot read or options that make
no sense, so the CLI can print one line and stop.
"""

from __future__ import annotations

from reliable.errors import ReliableError


class ReconcileError(ReliableError):
    """Root of every error raised by :mod:`reliable.reconcile`."""


class InputError(ReconcileError):
    """An input (database URL, Parquet directory, table) is missing, unreachable or has the wrong shape."""


class OptionError(ReconcileError):
    """An option is malformed or contradicts another (e.g. ``--since`` after ``--until``)."""


class SparkUnavailableError(ReconcileError):
    """PySpark (the ``[spark]`` extra) or a Java runtime is not installed."""
