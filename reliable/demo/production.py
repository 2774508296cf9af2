"""Producing the run's orders and waiting for them to settle, as far as the tables say.

:class:`ProgressTracker` reads the progress from the database (and the broker's lag) into the live display's
:class:`~reliable.demo.progress.ProgressState`; :class:`Production` sends the orders through the stub-first
producer, throttled by the slowest consumer group, then waits until every group's inbox row of every order is
CONFIRMED or DEAD. Both keep the consumers alive while they wait (a worker that died on its own is replaced).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from sqlalchemy import Engine

from reliable.demo import database, ledger, stats
from reliable.demo.chaos import ChaosController
from reliable.demo.consumers import ConsumerPool
from reliable.demo.errors import DemoTimeoutError
from reliable.demo.options import DemoOptions
from reliable.demo.progress import ProgressState
from reliable.demo.topology import Topology
from reliable.facade import Reliability
from reliable.producer import StubProducer
from reliable.sender import Sender

log = logging.getLogger("reliable.demo")


class ProgressTracker:
    """The run's progress from the tables of ``engine`` for ``topic`` and its consumer ``groups``."""

    def __init__(
        self, engine: Engine, topic: str, groups: list[str], state: ProgressState, topology: Topology
    ) -> None:
        self.engine = engine
        self.topic = topic
        self.groups = groups
        self.state = state
        self.topology = topology
        #: orders the slowest group has applied: production waits for it, so no group's backlog grows
        #: without bound (and the chaos faults hit every group while it is busy)
        self.slowest_applied = 0

    def snapshot(self) -> stats.Snapshot:
        return stats.snapshot(self.engine, self.topic)

    def refresh(self) -> stats.Snapshot:
        snap = self.snapshot()
        self.state.applied = snap.confirmed
        self.slowest_applied = min(snap.group(g).confirmed for g in self.groups)
        lags = [self.topology.lag(self.topic, g) for g in self.groups]
        self.state.lag = None if None in lags else sum(x or 0 for x in lags)
        return snap

    def safe_refresh(self) -> stats.Snapshot | None:
        try:
            return self.refresh()
        except Exception as exc:  # the database may be briefly unreachable under chaos: try again next poll
            log.warning("progress query failed: %s: %s", type(exc).__name__, exc)
            return None


class Production:
    """Sends ``orders`` through ``sender`` and waits for them to settle; a stall past the run's timeout is
    a :class:`DemoTimeoutError` (with a note for the summary in ``notes``)."""

    #: how long production may wait, over the whole run, for due send-side faults to fire
    send_fault_wait_s = 20.0

    def __init__(
        self,
        options: DemoOptions,
        rel: Reliability,
        sender: Sender,
        orders: list[ledger.Order],
        progress: ProgressTracker,
        consumers: ConsumerPool,
        chaos: ChaosController | None,
        stop: threading.Event,
        notes: list[str],
        log_dir: Path,
    ) -> None:
        self.o = options
        self.rel = rel
        self.sender = sender
        self.orders = orders
        self.progress = progress
        self.state = progress.state
        self.consumers = consumers
        self.chaos = chaos
        self._stop = stop
        self.notes = notes
        self.log_dir = log_dir
        self._send_fault_budget_s = self.send_fault_wait_s

    def produce(self) -> None:
        self.state.phase = "producing"
        producer = StubProducer(self.rel, self.sender)
        window = max(200, self.o.messages // 8) if self.o.chaos else self.o.messages
        deadline = time.monotonic() + self.o.timeout_s
        topic, groups = self.progress.topic, self.progress.groups
        for start in range(0, len(self.orders), self.o.batch):
            while self.state.produced - self.progress.slowest_applied > window and not self._stop.is_set():
                if time.monotonic() > deadline:
                    self.notes.append(f"consumers did not keep up within {self.o.timeout_s:.0f} s")
                    raise DemoTimeoutError(f"production stalled at {self.state.produced} orders")
                self.progress.safe_refresh()
                self.consumers.replace_dead()  # the throttle waits on consumers: keep them alive
                self._stop.wait(0.1)
            batch = self.orders[start : start + self.o.batch]
            database.stage_batch(producer, self.rel.engine, topic, groups, batch)
            self.state.produced += len(batch)
            self._let_send_faults_fire()
        self.state.phase = "consuming"

    def _let_send_faults_fire(self) -> None:
        """Wait until the send-side faults due at this point of production have fired: a short run produces
        faster than the chaos thread polls, and a lost-ACK fault armed after the last send would bite
        nothing. The chaos thread fires in schedule order (an earlier consumer-side fault waits for the
        applied fraction, refreshed here) and a fault may take a while (a broker restart), so the waits of a
        run share one budget (:attr:`send_fault_wait_s`) and production never stalls for long."""
        while self.chaos is not None and self.chaos.send_side_due(self.state.produced / self.o.messages):
            if self._send_fault_budget_s <= 0 or self._stop.wait(0.05):
                return
            self._send_fault_budget_s -= 0.05
            self.progress.safe_refresh()  # an earlier consumer-side fault waits for the applied fraction

    def settle(self) -> None:
        """Until every group's inbox row of every order is CONFIRMED or DEAD (or the run's timeout)."""
        deadline = time.monotonic() + self.o.timeout_s
        while True:
            snap = self.progress.safe_refresh()
            if snap is not None and snap.settled >= self.state.total:
                return
            if time.monotonic() > deadline:
                self.notes.append(f"did not settle within {self.o.timeout_s:.0f} s")
                raise DemoTimeoutError(
                    f"not every group's inbox row is CONFIRMED or DEAD after {self.o.timeout_s:.0f} s "
                    f"({snap.settled if snap else '?'}/{self.state.total}); logs in {self.log_dir}"
                )
            self.consumers.replace_dead()
            self._stop.wait(0.25)
