"""p1–p3: the stub-first producer and the RabbitMQ consumer adapter against their naive baselines.

All three use PostgreSQL (a scratch database of this run), the local RabbitMQ and Redis, and time the two
sides in alternating chunks (ours, baseline, ours, …) so background load on a shared machine hits both alike.

* p1 — one business transaction per message. Ours: insert the order and ``producer.stage()`` it in the same
  transaction; the after-commit hook sends with a publisher confirm and records the receipt. Baseline: the
  same insert, commit, then the same confirmed ``RabbitMQSender.send`` (write-then-send, which loses the
  message if the process dies between commit and send). The ratio is the price of never losing it.
* p2 — the same with 32 orders per transaction (``producer.transaction()``; one re-read and one result
  transaction per batch instead of per message).
* p3 — consuming: ``RabbitMQConsumer`` running an ``@idempotent_consumer`` handler (journal, Redis lease,
  stub lock + confirm, business insert) ÷ a bare pika consumer doing the business insert and ``basic_ack``.

No targets are set by the issues for these; the figures are recorded in docs/benchmarks/producer.md.

``python -m bench.bench_producer [--n 600] [--chunks 3]`` (``python -m bench producer`` uses the defaults)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pika
from sqlalchemy import Column, Integer, MetaData, String, Table
from sqlalchemy.orm import Session

from bench.harness import database
from reliable import ConsumeResult, Envelope, Reliability, StubProducer, idempotent_consumer
from reliable.adapters.rabbitmq import RabbitMQConsumer, RabbitMQSender, Topology
from reliable.sender import OutgoingMessage

REDIS_URL = os.environ.get("RELIABLE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("RELIABLE_BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
GROUP = "bench-g"

_md = MetaData()
orders = Table(
    "bench_order",
    _md,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ref", String(64), nullable=False),
)


@contextlib.contextmanager
def queue() -> Iterator[Topology]:
    topo = Topology(queue=f"bench-{uuid.uuid4().hex[:10]}")
    _on_fresh_connection(topo.declare)
    try:
        yield topo
    finally:
        _on_fresh_connection(topo.delete)


def _on_fresh_connection(step: Callable[[Any], None]) -> None:
    """Run ``step(channel)`` on a new connection: one left idle through a long run misses its heartbeats."""
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        step(conn.channel())
    finally:
        conn.close()


def interleaved(
    sides: Sequence[Callable[[Sequence[str]], None]], ids: Sequence[Sequence[str]], chunks: int
) -> list[float]:
    spent = [0.0] * len(sides)
    for c in range(chunks):
        for i, run in enumerate(sides):
            size = -(-len(ids[i]) // chunks)
            t = time.perf_counter()
            run(ids[i][c * size : (c + 1) * size])
            spent[i] += time.perf_counter() - t
    return [len(ids[i]) / spent[i] for i in range(len(sides))]


def show(name: str, ours: float, base: float, label: str) -> None:
    print(f"{name}: {label}: ours {ours:,.0f} msg/s, baseline {base:,.0f} msg/s, ratio {ours / base:.2f}")


def fresh(tag: str, n: int) -> list[str]:
    run = uuid.uuid4().hex[:6]
    return [f"{tag}-{run}-{i}" for i in range(n)]


def producing(rel: Reliability, n: int, chunks: int, per_tx: int) -> tuple[float, float]:
    with queue() as topo, RabbitMQSender(AMQP_URL) as sender:
        producer = StubProducer(rel, sender, default_group=GROUP)

        def ours(ids: Sequence[str]) -> None:
            for i in range(0, len(ids), per_tx):
                with producer.transaction() as tx:
                    for mid in ids[i : i + per_tx]:
                        tx.session.execute(orders.insert().values(ref=mid))
                        tx.stage(mid, topo.queue, b'{"amount": 10}')

        def baseline(ids: Sequence[str]) -> None:
            for i in range(0, len(ids), per_tx):
                part = ids[i : i + per_tx]
                with rel.session() as s:
                    for mid in part:
                        s.execute(orders.insert().values(ref=mid))
                for mid in part:
                    sender.send(OutgoingMessage(mid, topo.queue, b'{"amount": 10}', GROUP))

        a, b = interleaved([ours, baseline], [fresh("po", n), fresh("pb", n)], chunks)
        return a, b


def consuming(rel: Reliability, n: int, chunks: int) -> tuple[float, float]:
    @idempotent_consumer(rel, group=GROUP)
    def guarded(env: Envelope, session: Session) -> None:
        session.execute(orders.insert().values(ref=env.message_id))

    def bare_handler(env: Envelope) -> ConsumeResult:
        with rel.session() as s:
            s.execute(orders.insert().values(ref=env.message_id))
        return ConsumeResult.SUCCESS

    with queue() as q_ours, queue() as q_base, RabbitMQSender(AMQP_URL) as sender:
        producer = StubProducer(rel, sender, default_group=GROUP)

        def fill(topo: Topology, ids: Sequence[str], stubs: bool) -> None:
            for mid in ids:
                if stubs:
                    producer.publish(mid, topo.queue, b"{}")
                else:
                    sender.send(OutgoingMessage(mid, topo.queue, b"{}", GROUP))

        def drain(topo: Topology, handler: Callable[[Envelope], Any]) -> Callable[[Sequence[str]], None]:
            consumer = RabbitMQConsumer(AMQP_URL, topo, handler, prefetch=64, declare=False)
            consumers.append(consumer)

            expected = [0]

            def run(ids: Sequence[str]) -> None:
                # cumulative: one poll may settle more than a chunk (prefetch), the totals stay exact
                expected[0] += len(ids)
                target = expected[0]
                if not consumer.run(until=lambda: consumer.counts["ack"] >= target, timeout_s=300):
                    raise RuntimeError(f"benchmark consumer timed out: {dict(consumer.counts)}")

            return run

        ids_ours, ids_base = fresh("co", n), fresh("cb", n)
        fill(q_ours, ids_ours, stubs=True)
        fill(q_base, ids_base, stubs=False)
        consumers: list[RabbitMQConsumer] = []
        try:
            sides = [drain(q_ours, guarded), drain(q_base, bare_handler)]
            a, b = interleaved(sides, [ids_ours, ids_base], chunks)
        finally:
            for c in consumers:
                c.close()
        return a, b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_producer")
    ap.add_argument("--n", type=int, default=600, help="messages per side")
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--only", choices=["p1", "p2", "p3"])
    args = ap.parse_args(argv)
    with database("postgres") as url:  # the benches' scratch PostgreSQL database
        rel = Reliability(url, REDIS_URL, key_prefix=f"bp{uuid.uuid4().hex[:8]}")
        rel.create_schema()
        _md.create_all(rel.engine)
        try:
            if args.only in (None, "p1"):
                show("p1", *producing(rel, args.n, args.chunks, 1), "stub-first ÷ write-then-send, 1/tx")
            if args.only in (None, "p2"):
                show("p2", *producing(rel, args.n, args.chunks, 32), "stub-first ÷ write-then-send, 32/tx")
            if args.only in (None, "p3"):
                show("p3", *consuming(rel, args.n, args.chunks), "RabbitMQConsumer+guard ÷ bare ack consumer")
        finally:
            rel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
