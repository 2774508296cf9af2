"""The topology a production team runs, end to end on Tansu, PostgreSQL and Redis.

One topic with 3 partitions; a stub-first producer expecting three consumer groups: ``a`` (one member,
killed mid-stream with uncommitted offsets, then restarted), ``b`` (a second member joins while messages
flow; its handler fails some messages transiently and one for good) and ``c`` (expected, never consumes).
Then the sweeper and the reconciliation report run over what happened. What a user needs, per group: every
message's database effect exactly once, nothing silently lost, the dead one dead-lettered with its reason and
a person told, the group that never consumed raised as an alarm (not resent), and report counts that agree.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, StubProducer, idempotent_consumer
from reliable import constants as C
from reliable.adapters.kafka import KafkaGuardedConsumer, KafkaSender, RetryPolicy, ensure_topics
from reliable.demo.tansu import Tansu
from reliable.models import MessageInbox
from reliable.sweeper import Sweeper
from reliable.sweeper.notices import NoticeKind
from tests.adapters.kafka.conftest import Workers
from tests.adapters.kafka.helpers import (
    TIMEOUT_S,
    apply_effect,
    effect_counts,
    headers_of,
    log_rows,
    make_consumer,
    read_all,
    worker_status,
)
from tests.sweeper.helpers import MemoryChannel
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
PARTITIONS = 3
POLICY = RetryPolicy(delays_s=(0.3,))  # what the worker processes use too (unscoped: shared retry topics)
TRANSIENT = {"m007", "m021", "m044"}  # fail once in group b, then succeed
POISON = "m013"  # fails every time in group b


def _inbox(rel: Reliability, group: str) -> dict[str, str]:
    stmt = select(MessageInbox.message_id, MessageInbox.status).where(MessageInbox.consumer_group == group)
    with rel.session() as s:
        return {m: str(getattr(st, "value", st)) for m, st in s.execute(stmt)}


class GroupB:
    """Group b's handler (shared by both members): transient failures once, the poison one always."""

    def __init__(self, group: str) -> None:
        self.effect = apply_effect(group)
        self.failed: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, env: Envelope, session: Session) -> None:
        if env.message_id == POISON:
            raise ValueError(f"{POISON}: the account it names does not exist")
        mid = env.message_id or ""
        with self.lock:
            first = mid in TRANSIENT and mid not in self.failed
            self.failed.add(mid)
        if first:
            raise ConnectionError(f"{mid}: downstream timed out")
        self.effect(env, session)


def test_three_groups_one_killed_one_rebalanced_one_absent_sweeper_and_report_agree(
    tansu: Tansu,
    rel: Reliability,
    postgres_url: str,
    redis_url: str,
    key_prefix: str,
    topic: str,
    tmp_path: Path,
    workers: Workers,
) -> None:
    suffix = topic.split("-")[1]
    a, b, c = (f"{n}-{suffix}" for n in ("a", "b", "c"))
    ensure_topics(tansu.bootstrap, POLICY.all_topics(topic), partitions=PARTITIONS)
    sender = KafkaSender(tansu.bootstrap, timeout_s=5.0)
    producer = StubProducer(rel, sender)
    ids = [f"m{i:03d}" for i in range(60)]

    def publish(batch: list[str]) -> None:
        for mid in batch:
            assert producer.publish(mid, topic, f"body-{mid}".encode(), groups=[a, b, c]).receipt is not None

    common = dict(bootstrap=tansu.bootstrap, topic=topic, db=postgres_url, redis=redis_url, prefix=key_prefix)
    victim, victim_status = workers("a-victim", group=a, die_after=7, **common)
    handler_b = GroupB(b)
    guard_b = idempotent_consumer(rel, group=b)(handler_b)
    b1 = make_consumer(tansu.bootstrap, topic, b, guard_b, retry=POLICY, batch_size=5)
    b2: KafkaGuardedConsumer | None = None
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def loop(consumer: KafkaGuardedConsumer) -> None:
        consumer.run(until=stop.is_set)

    threads.append(threading.Thread(target=loop, args=(b1,), daemon=True))
    threads[-1].start()
    try:
        wait_until(
            lambda: len(b1.assigned) > 0 and len(worker_status(victim_status)["assigned"]) > 0,
            TIMEOUT_S,
            "a, b",
        )
        publish(ids[:20])
        assert victim.wait(TIMEOUT_S) == -signal.SIGKILL  # a dies mid-stream, offsets uncommitted
        wait_until(lambda: b1.counts["success"] >= 5, TIMEOUT_S, "b under way")
        b2 = make_consumer(tansu.bootstrap, topic, b, guard_b, retry=POLICY, batch_size=5)
        threads.append(threading.Thread(target=loop, args=(b2,), daemon=True))
        threads[-1].start()
        publish(ids[20:40])  # while b rebalances
        workers("a-restarted", group=a, **common)  # a comes back
        publish(ids[40:])

        def settled() -> bool:
            return (
                effect_counts(rel.engine, a).keys() == set(ids)
                and effect_counts(rel.engine, b).keys() == set(ids) - {POISON}
                and _inbox(rel, b).get(POISON) == "DEAD"
            )

        wait_until(settled, 90, "both groups through every message")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        b1.close()
        if b2 is not None:
            b2.close()
    # exactly once per group, nothing lost
    assert effect_counts(rel.engine, a) == {i: 1 for i in ids}
    assert effect_counts(rel.engine, b) == {i: 1 for i in ids if i != POISON}
    assert _inbox(rel, a) == {i: "CONFIRMED" for i in ids}
    assert _inbox(rel, b) == {i: ("DEAD" if i == POISON else "CONFIRMED") for i in ids}
    assert _inbox(rel, c) == {i: "PENDING" for i in ids}
    # the poison message is in the dead-letter topic once, with its reason and its group
    dead = read_all(tansu.bootstrap, POLICY.dlt_topic(topic), expect=1, partitions=PARTITIONS)
    assert [m.key() for m in dead] == [POISON.encode()]
    reason = headers_of(dead[0])[C.KAFKA_HEADER_REASON]
    assert "account it names does not exist" in reason, reason

    # the sweeper: an hour on, nothing resent (a and b have everything; c never consumed: an alarm)
    channel = MemoryChannel()
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    sweeper = Sweeper(rel, sender, channels=[channel], clock=lambda: later)
    first = sweeper.run_once()
    second = Sweeper(
        rel, sender, channels=[channel], clock=lambda: later + dt.timedelta(minutes=5)
    ).run_once()
    sender.close()
    assert first.resent == 0 and second.resent == 0, (first.line(), second.line())
    dead_told = [n for n in channel.notices if n.kind is NoticeKind.DEAD]
    assert [(n.consumer_group, n.message_id) for n in dead_told] == [(b, POISON)]
    never = [n for n in channel.notices if n.kind is NoticeKind.NEVER_CONSUMED]
    assert {n.consumer_group for n in never} == {c}
    assert len(never) == PARTITIONS  # one per queue, raised once over two rounds

    # the report over a Parquet export agrees with what happened
    export_dir, out = tmp_path / "export", tmp_path / "report"
    env = {**os.environ, "RELIABLE_DB_URL": postgres_url}
    py = sys.executable
    subprocess.run([py, "-m", "reliable.cli", "export", "--to", str(export_dir), "-q"], env=env, check=True)
    ran = subprocess.run(
        [py, "-m", "reliable.cli", "reconcile", "--parquet", str(export_dir), "--out", str(out), "-q",
         "--master", "local[2]", "--as-of", later.isoformat()],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert ran.returncode in (0, 2), ran.stderr
    summary = json.loads((out / "summary.json").read_text())
    groups = {g["consumer_group"]: g for g in summary["groups"]}
    expected = {a: (60, 0, 0), b: (59, 1, 0), c: (0, 0, 60)}
    assert {g: (v["confirmed"], v["dead"], v["pending"]) for g, v in groups.items()} == expected
    for g in (a, b, c):
        assert (groups[g]["lost"], groups[g]["stuck"], groups[g]["unsent"]) == (0, 0, 0), g
        assert groups[g]["deliveries"] == len(log_rows(rel.engine, g)), g
    assert summary["attention"]["dead"]["pairs"] == [{"consumer_group": b, "message_id": POISON}]
    never_queues = {(q["consumer_group"], q["queue_id"]) for q in summary["never_consumed"]}
    assert never_queues == {(c, p) for p in range(PARTITIONS)}
    assert sum(q["pending"] for q in summary["never_consumed"]) == len(ids)
    # b's extra deliveries are its retries (three transient failures, the poison's one retry)
    assert groups[b]["duplicates_by_cause"]["retry"] == len(TRANSIENT) + 1
