"""The seeded chaos schedule: which fault fires when, the same for the same seed.

A schedule is a list of :class:`PlannedFault`, each with a trigger point expressed as a fraction of the run's
progress rather than wall time, so a slow machine sees the same faults in the same places of the message
stream as a fast one. Send-side faults (lost send ACKs, broker crash, a cluster's master or slave loss)
trigger on the *produced* fraction; consume-side faults (consumer SIGKILL, lost offset commits, rebalance
storms, Redis and database faults)
trigger on the *applied* fraction, so they hit consumers while they are busy.

The runner executes a schedule through the :class:`ChaosTarget` protocol; a target that cannot inject a kind
raises :class:`FaultUnsupported` and the fault is recorded as skipped with the reason (never silently).
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from reliable.demo.errors import DemoError

log = logging.getLogger("reliable.demo.chaos")


class FaultKind(enum.StrEnum):
    LOST_SEND_ACK = "lost_send_ack"  # the broker stores the message, the producer sees a failure
    CONSUMER_KILL = "consumer_kill"  # SIGKILL a consumer process mid-batch, start a replacement
    BROKER_CRASH = "broker_crash"  # kill -9 the broker and start it again on the same store
    LOST_OFFSET_COMMIT = "lost_offset_commit"  # a consumer's offset commits never reach the broker
    REBALANCE_STORM = "rebalance_storm"  # consumers join and leave the group in quick succession
    REDIS_FLUSHALL = "redis_flushall"  # every lease and done marker vanishes
    REDIS_DOWN = "redis_down"  # Redis unreachable for a while
    DB_CONNECTION_DROP = "db_connection_drop"  # every pooled database connection is cut
    MASTER_LOSS = "master_loss"  # a cluster group's master loses power for seconds, then restarts
    SLAVE_LOSS = "slave_loss"  # a cluster group's slave loses power for seconds, then restarts


#: kinds whose trigger is the produced fraction (the rest trigger on the applied fraction)
SEND_SIDE = frozenset(
    {FaultKind.LOST_SEND_ACK, FaultKind.BROKER_CRASH, FaultKind.MASTER_LOSS, FaultKind.SLAVE_LOSS}
)
#: kinds that need a cluster of broker groups with slaves (``--brokers N --slaves M``)
CLUSTER_ONLY = frozenset({FaultKind.MASTER_LOSS, FaultKind.SLAVE_LOSS})
#: the schedule of a run on one broker (the kinds, hence the seeds' schedules, from before clusters)
SINGLE_BROKER = frozenset(FaultKind) - CLUSTER_ONLY


def kinds_for(brokers: int, slaves: int) -> frozenset[FaultKind]:
    """The fault kinds of a run: on one broker the classic set; on a cluster the master loss replaces the
    whole-broker crash (a group's master is what dies there), plus a slave loss when there are slaves."""
    if brokers < 2 and slaves < 1:
        return SINGLE_BROKER
    kinds = (SINGLE_BROKER - {FaultKind.BROKER_CRASH}) | {FaultKind.MASTER_LOSS}
    return kinds | {FaultKind.SLAVE_LOSS} if slaves >= 1 else kinds


class FaultUnsupported(DemoError):
    """The current set-up cannot inject this kind of fault (recorded as skipped, with this reason)."""


@dataclass(frozen=True, slots=True)
class PlannedFault:
    """One fault of the schedule. ``param`` is kind-specific (count of ACKs, consumer slot, milliseconds)."""

    at: float
    kind: FaultKind
    param: int


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """What happened when a planned fault fired."""

    kind: FaultKind
    at: float
    elapsed_s: float
    injected: bool
    detail: str


def plan(seed: int, kinds: frozenset[FaultKind] | None = None) -> list[PlannedFault]:
    """The schedule for ``seed``: every kind once or twice, at trigger points spread over the run.

    Broker crashes stay in the first 70 % of production so that later sends move the consumer watermark past
    whatever the crash lost, which is what lets the sweeper tell "lost" from "still queued". Everything else
    fires between 5 % and 90 %, so there is always work in flight to disturb.
    """
    rng = random.Random(f"chaos:{seed}")
    chosen = sorted(kinds if kinds is not None else SINGLE_BROKER)
    faults: list[PlannedFault] = []
    for kind in chosen:
        for _ in range(rng.choice((1, 2))):
            hi = 0.7 if kind in (FaultKind.BROKER_CRASH, *CLUSTER_ONLY) else 0.9
            at = round(rng.uniform(0.05, hi), 3)
            faults.append(PlannedFault(at, kind, _param(kind, rng)))
    faults.sort(key=lambda f: (f.at, f.kind.value))
    return faults


def _param(kind: FaultKind, rng: random.Random) -> int:
    if kind is FaultKind.LOST_SEND_ACK:
        return rng.randint(3, 12)  # ACKs lost in a row
    if kind in (FaultKind.CONSUMER_KILL, FaultKind.LOST_OFFSET_COMMIT):
        return rng.randrange(1 << 16)  # which consumer (modulo the live ones)
    if kind is FaultKind.REBALANCE_STORM:
        return rng.randint(2, 4)  # consumers that join and then leave
    if kind is FaultKind.REDIS_DOWN:
        return rng.randint(1500, 4000)  # milliseconds down
    if kind is FaultKind.BROKER_CRASH:
        return rng.randint(200, 800)  # milliseconds before the restart
    if kind in CLUSTER_ONLY:
        return rng.randint(2000, 4000)  # milliseconds down: long enough for sends elsewhere and slave reads
    return 0


class ChaosTarget(Protocol):
    """What the runner offers the chaos controller. Each method injects one fault and says what it did."""

    def lose_send_acks(self, count: int) -> str: ...
    def kill_consumer(self, slot: int) -> str: ...
    def crash_broker(self, down_ms: int) -> str: ...
    def lose_offset_commits(self, slot: int) -> str: ...
    def rebalance_storm(self, joiners: int) -> str: ...
    def redis_flushall(self) -> str: ...
    def redis_down(self, down_ms: int) -> str: ...
    def drop_db_connections(self) -> str: ...
    def lose_master(self, down_ms: int) -> str: ...
    def lose_slave(self, down_ms: int) -> str: ...


def inject(target: ChaosTarget, fault: PlannedFault) -> str:
    """Inject one fault through ``target``; returns its description (FaultUnsupported propagates)."""
    k = fault.kind
    if k is FaultKind.LOST_SEND_ACK:
        return target.lose_send_acks(fault.param)
    if k is FaultKind.CONSUMER_KILL:
        return target.kill_consumer(fault.param)
    if k is FaultKind.BROKER_CRASH:
        return target.crash_broker(fault.param)
    if k is FaultKind.LOST_OFFSET_COMMIT:
        return target.lose_offset_commits(fault.param)
    if k is FaultKind.REBALANCE_STORM:
        return target.rebalance_storm(fault.param)
    if k is FaultKind.REDIS_FLUSHALL:
        return target.redis_flushall()
    if k is FaultKind.REDIS_DOWN:
        return target.redis_down(fault.param)
    if k is FaultKind.MASTER_LOSS:
        return target.lose_master(fault.param)
    if k is FaultKind.SLAVE_LOSS:
        return target.lose_slave(fault.param)
    return target.drop_db_connections()


@dataclass
class ChaosController:
    """Fires a schedule as the run progresses, on a thread of its own.

    ``produced`` and ``applied`` return the current fractions (0..1); the controller polls them (an
    ``Event`` wait, so ``stop`` is prompt) and fires each fault once its trigger point is passed.
    """

    schedule: list[PlannedFault]
    target: ChaosTarget
    produced: Callable[[], float]
    applied: Callable[[], float]
    records: list[FaultRecord] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = field(default_factory=time.monotonic)

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="chaos", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def finish(self) -> None:
        """Fire whatever is left (the run ended before its trigger point), then stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        for fault in self.schedule:
            self._fire(fault)
        self.schedule.clear()

    @property
    def pending(self) -> int:
        return len(self.schedule)

    def send_side_due(self, produced: float) -> bool:
        """True while a send-side fault whose trigger point ``produced`` has passed has not fired yet.

        The producer waits on this between batches: a short run produces faster than the chaos thread polls,
        and a lost-ACK fault armed after the last send would bite nothing.
        """
        return not self._stop.is_set() and any(
            f.kind in SEND_SIDE and f.at <= produced for f in list(self.schedule)
        )

    def _run(self) -> None:
        while self.schedule and not self._stop.is_set():
            fault = self.schedule[0]
            now = self.produced() if fault.kind in SEND_SIDE else self.applied()
            if now >= fault.at:
                self.schedule.pop(0)
                self._fire(fault)
            else:
                self._stop.wait(0.05)

    def _fire(self, fault: PlannedFault) -> None:
        elapsed = time.monotonic() - self._t0
        try:
            detail = inject(self.target, fault)
            injected = True
        except FaultUnsupported as exc:
            detail, injected = f"skipped: {exc}", False
        except Exception as exc:  # a fault that fails to inject is reported, and the run goes on
            log.exception("injecting %s failed", fault.kind)
            detail, injected = f"failed: {type(exc).__name__}: {exc}", False
        log.info("chaos %s at %.2f: %s", fault.kind, fault.at, detail)
        self.records.append(FaultRecord(fault.kind, fault.at, round(elapsed, 2), injected, detail))
