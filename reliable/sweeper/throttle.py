"""Pacing for background work that shares the database with consumers (the retention purge).

A purge of millions of rows is not urgent; the consumers next to it are. On a small machine the purge's one
busy backend takes a core and a share of the disk from them, which no lock analysis shows. So the purge
works in short transactions and rests between them: after a batch that took ``t`` seconds it rests
``t · (1 − duty) / duty`` — at the default duty cycle of 0.5 it works half the time — and longer, up to
``max_backoff`` times, while its batches take longer than the fastest one it has seen: a batch that slows
down is the sign of a database busy with something else (the consumers), and the purge backs off from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from reliable import constants as C
from reliable.sweeper.errors import SweeperConfigError


@dataclass
class Throttle:
    """How long to rest after each batch (:meth:`rest_after`), from the batch's own duration."""

    duty_cycle: float = C.DEFAULT_PURGE_DUTY_CYCLE
    max_backoff: float = C.PURGE_MAX_BACKOFF
    #: the fastest batch so far: the duration of a batch on an otherwise idle database, as near as we know
    fastest: float = field(default=math.inf, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.duty_cycle <= 1:
            raise SweeperConfigError(f"duty cycle must be in (0, 1], got {self.duty_cycle!r}")
        if self.max_backoff < 1:
            raise SweeperConfigError(f"max_backoff must be >= 1, got {self.max_backoff!r}")

    def rest_after(self, took: float) -> float:
        """Seconds to rest after a batch that took ``took`` seconds."""
        took = max(took, 0.0)
        self.fastest = min(self.fastest, took)
        if self.duty_cycle >= 1:
            return 0.0
        slower = took / self.fastest if self.fastest > 0 else 1.0
        return took * (1 - self.duty_cycle) / self.duty_cycle * min(max(slower, 1.0), self.max_backoff)
