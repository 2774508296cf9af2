"""The run's consumer workers: started from one configuration, replaced when they die on their own, picked as
the victims of chaos faults, and stopped at the end.

Each worker (a process, or a thread in-process mode) runs one PushConsumer per consumer group. A worker the
chaos kills is taken out of the pool *before* it dies, so only a worker that died on its own is "replaced"
(and reported, and counted by the :class:`~reliable.demo.crashloop.CrashLoopGuard`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from reliable.demo.chaos import FaultUnsupported
from reliable.demo.crashloop import CrashLoopGuard
from reliable.demo.progress import ProgressState
from reliable.demo.services import WorkerConfig
from reliable.demo.topology import ConsumerSlot, Topology

log = logging.getLogger("reliable.demo")


class ConsumerPool:
    """The live consumer workers of a run (thread-safe: the chaos thread and the runner both change it).

    ``config`` is every worker's configuration but its name; ``notes`` is where the run's summary collects
    what happened to them.
    """

    def __init__(
        self,
        topology: Topology,
        config: WorkerConfig,
        state: ProgressState,
        crash_loop: CrashLoopGuard,
        notes: list[str],
    ) -> None:
        self.topology = topology
        self.config = config
        self.state = state
        self.crash_loop = crash_loop
        self.notes = notes
        self._slots: list[ConsumerSlot] = []
        self._lock = threading.Lock()
        self._serial = 0

    def add(self) -> ConsumerSlot:
        """Start one more worker."""
        with self._lock:
            self._serial += 1
            name = f"consumer-{self._serial}"
        slot = self.topology.start_consumer(
            dataclasses.replace(self.config, name=name, groups=list(self.config.groups))
        )
        with self._lock:
            self._slots.append(slot)
            self.state.consumers = len(self._slots)
        return slot

    def start(self, count: int) -> None:
        for _ in range(count):
            self.add()

    def live(self) -> list[ConsumerSlot]:
        with self._lock:
            return [s for s in self._slots if s.alive()]

    def pick(self, slot: int) -> ConsumerSlot:
        """The live worker ``slot`` designates (modulo the live ones)."""
        with self._lock:
            return self._pick_locked(slot)

    def take(self, slot: int) -> ConsumerSlot:
        """Like :meth:`pick`, and out of the pool at once: the caller is about to kill it."""
        with self._lock:
            victim = self._pick_locked(slot)
            self._slots.remove(victim)
            return victim

    def _pick_locked(self, slot: int) -> ConsumerSlot:
        live = [s for s in self._slots if s.alive()]
        if not live:
            raise FaultUnsupported("no live consumer")
        return live[slot % len(live)]

    def retire(self, slot: ConsumerSlot) -> None:
        """Stop ``slot`` cleanly (it leaves its group), out of the pool first."""
        with self._lock:
            self._slots.remove(slot)
            self.state.consumers = len(self._slots)
        self.topology.stop_consumer(slot)

    def replace_dead(self) -> None:
        """A worker that died on its own (not by chaos) is replaced, and the run says so."""
        with self._lock:
            dead = [s for s in self._slots if not s.alive()]
            for s in dead:
                self._slots.remove(s)
        for s in dead:  # a start-up bug stops the run here, at once, not as a timeout (crashloop.py)
            self.crash_loop.died(s.name, s.started_at, s.exit_reason())
            self.notes.append(f"{s.name} exited unexpectedly ({s.exit_reason()}) and was replaced")
            self.add()

    def stop_all(self) -> None:
        """Stop every worker (idempotent); one that fails to stop is logged and the others still stop."""
        with self._lock:
            slots = list(self._slots)
            self._slots.clear()
        for slot in slots:
            try:
                self.topology.stop_consumer(slot)
            except Exception:
                log.warning("stopping %s failed", slot.name, exc_info=True)
