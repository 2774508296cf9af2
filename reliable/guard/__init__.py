"""The consumer guard package (DESIGN.md §2): exactly-once effect per ``(consumer group, message id)``.

Modules, in the order a delivery meets them:

* :mod:`reliable.guard.decision` — the vocabulary and pure rules (``Reason``, ``OUTCOMES``, ``judge``, …);
  imports no store.
* :mod:`reliable.guard.plan` — per-delivery state and the pure bookkeeping steps (shared with asyncio).
* :mod:`reliable.guard.core` — :class:`Guard`, the synchronous orchestrator that owns its collaborators.
* :mod:`reliable.guard.work` — :class:`WorkTransaction`, step 3 (lock/claim, handler, confirm).
"""

from __future__ import annotations

from reliable.guard.core import Guard
from reliable.guard.decision import Decision, GuardHooks, Reason
from reliable.guard.work import Handler

__all__ = ["Decision", "Guard", "GuardHooks", "Handler", "Reason"]
