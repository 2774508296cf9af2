"""Compatibility path: the definitions live in :mod:`broker_sim.common.scheduler`
(the ``common`` floor that broker and client both build on); this module re-exports them for code written
against the old path."""

from __future__ import annotations

from broker_sim.common.scheduler import (
    Handle as Handle,
)
from broker_sim.common.scheduler import (
    Scheduler as Scheduler,
)
