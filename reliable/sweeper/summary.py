"""What one sweep round did: the counts its log line, its metrics and its callers read (``run_once``).

One dataclass the round fills as it goes (each batch's :class:`~reliable.sweeper.resend.BatchResult` is added
to it), kept apart from the round's steps so the sweeper module stays the orchestrator.
"""

from __future__ import annotations

from dataclasses import dataclass

from reliable.sweeper.resend import BatchResult


@dataclass
class RoundSummary:
    selected: int = 0
    resent: int = 0
    send_failures: int = 0
    dead: int = 0
    #: rows the guard set DEAD (its handler failed ``max_attempts`` times) told about this round
    dead_lettered: int = 0
    stuck_recovered: int = 0
    lease_held: int = 0
    lease_unknown: int = 0
    held: int = 0
    never_consumed: int = 0
    #: queues a group has stopped consuming (open stalls after the round), and how many were raised now
    stalled: int = 0
    stall_alarms: int = 0
    purged: int = 0
    notified: int = 0
    notify_failures: int = 0
    #: claimed rows left unsent because the claim window ran out first (due again next round)
    released: int = 0
    duration_s: float = 0.0

    def line(self) -> str:
        return (
            f"sweep round: selected={self.selected} resent={self.resent} send_failures={self.send_failures} "
            f"dead={self.dead} dead_lettered={self.dead_lettered} stuck_recovered={self.stuck_recovered} "
            f"lease_held={self.lease_held} "
            f"lease_unknown={self.lease_unknown} held={self.held} never_consumed={self.never_consumed} "
            f"stalled={self.stalled} stall_alarms={self.stall_alarms} purged={self.purged} "
            f"notified={self.notified} notify_failures={self.notify_failures} released={self.released} "
            f"duration={self.duration_s:.3f}s"
        )

    def add(self, result: BatchResult) -> None:
        self.resent += result.resent
        self.send_failures += result.send_failures
        self.stuck_recovered += result.stuck_recovered
        self.lease_held += result.lease_held
        self.lease_unknown += result.lease_unknown
        self.held += result.held + result.route_paused
        self.never_consumed += result.never_consumed
        self.dead += len(result.dead)
