"""End to end: an operator raises a busy topic from 4 to 8 queues (``mqadmin updateTopic -w 8 -r 8``) while
two consumer groups (guarded push consumers, CONSUME_FROM_LAST_OFFSET, two consumers each) read it.

RocketMQ 4.9.8: the producer writes to the new queues once its 30 s route poll ran; the groups take them at
their next rebalance, so messages are usually on a new queue before any group owns it. A group with no offset
there starts at the queue's max offset unless the queue's first message is still in the broker's memory
(``checkInDiskByConsumeOffset``: then at 0). The group that rebalances promptly reads them all; the one that
rebalances after heavy traffic pushed them out of memory skips them — a real loss the sweeper must repair
(its watermark there overtakes them, under load) or tell a person about (a never-consumed alarm, on a quiet
queue), without blaming the prompt group. Broker, producers and consumers on a manual clock (rebalances run
by hand, at the moments the 20 s timer would); the sweeper's clock moves by a skew. PostgreSQL and Redis.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, func, select

from reliable import Reliability
from reliable.models import MessageInbox, MessageLog, MessageStub, StubNotification, utcnow
from reliable.types import StubStatus
from tests.sweeper.helpers import TOLD, e2e_reliability
from tests.waiting import wait_until

pytest.importorskip("broker_sim.broker.broker")
pytest.importorskip("duckdb")

from bench import reconcile_duckdb as ref
from broker_sim.broker.broker import Broker
from broker_sim.client.producer import Producer
from broker_sim.client.push_consumer import PushConsumer
from broker_sim.clock import ManualClock
from broker_sim.common.message import Message
from broker_sim.common.requests import ConsumeFromWhere
from reliable.adapters.broker_sim import BrokerSimProbe, BrokerSimSender, GuardedListener, send_back_to_dlq
from reliable.decorator import GuardedHandler, idempotent_consumer
from reliable.producer import StubProducer
from reliable.reconcile.export import export_tables
from reliable.sweeper import FixedBackoff, Sweeper
from reliable.sweeper.notices import parse_tag
from reliable.sweeper.summary import RoundSummary

TOPIC, OTHER = "Expanding", "ExpandingOther"
PROMPT, LATE = "expand_prompt", "expand_late"
GROUPS = (PROMPT, LATE)
#: the broker's memory share (40 % of this): the first messages of a new queue leave it after ~40 KB more
MEMORY = 100_000
STUCK_AFTER_S, STALL_AFTER_S, MAX_AGE_S = 900, 1800, 24 * 3600
effects = MetaData()
applied = Table(
    "expansion_applied",
    effects,
    Column("consumer_group", String(64), primary_key=True),
    Column("message_id", String(64), primary_key=True),
)


@pytest.fixture
def rel(postgres_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    yield from e2e_reliability(postgres_url, effects, redis_url, key_prefix)


@dataclass
class Rig:
    rel: Reliability
    clock: ManualClock
    broker: Broker
    producer: Producer
    stubs: StubProducer
    sweeper: Sweeper
    consumers: dict[str, list[PushConsumer]]
    #: each consumer's guarded handler (its write-behind journal)
    guards: list[GuardedHandler]
    #: how far the sweeper's clock is ahead of the wall clock
    skew_s: float = 0.0

    def publish(self, prefix: str, n: int) -> list[str]:
        ids = [f"{prefix}-{i:02d}" for i in range(n)]
        with self.stubs.transaction() as tx:
            for message_id in ids:
                tx.stage(message_id, TOPIC, message_id.encode() + b"." * 100, groups=GROUPS)
        return ids

    def confirmed(self, group: str) -> int:
        with self.rel.engine.connect() as conn:
            return int(
                conn.scalar(
                    select(func.count()).where(
                        MessageInbox.consumer_group == group, MessageInbox.status == StubStatus.CONFIRMED
                    )
                )
                or 0
            )

    def rebalance(self, group: str) -> None:
        """The group's 20 s rebalance tick, now: each consumer takes its share of the topic's 8 queues — and
        has read each to the end from where it starts there.

        The tick hands two old queues from one consumer to the other. The one taking them may start from
        the offset the broker holds for the group, behind what the other consumed (that one commits its
        offsets every 5 s and with each pull, and drops the queues only at its own tick): it reads those
        messages again, and the guard logs each as a DUPLICATE — zero to four per group, as the threads
        run. ``confirmed`` does not wait for them (the group had them already), and the guard answers them
        from Redis's ``done`` marker, journaling them write-behind (up to 200 ms later, from a daemon
        thread): they were written while the test counted deliveries (``assert 36 == 32``: the report saw
        four more than the log count taken just before it). So the group reads its queues to the end, then
        its journal is written."""
        for c in self.consumers[group]:
            c.rebalance_now()

        def owned() -> list[int]:
            return sorted(
                q.queue_id for c in self.consumers[group] for q in c.assigned_queues() if q.topic == TOPIC
            )

        wait_until(lambda: owned() == list(range(8)), timeout=10, what=f"{group} owning the 8 queues")
        wait_until(lambda: self.read_to_the_end(group), timeout=20, what=f"{group} reading its queues")
        self.flush_journals()

    def flush_journals(self) -> None:
        """Write the duplicates each guard's write-behind journal holds (``GuardedHandler.flush_journal``)."""
        for guard in self.guards:
            guard.flush_journal()

    def read_to_the_end(self, group: str) -> bool:
        """Whether each consumer of ``group`` has finished every queue of the topic it owns, as
        ``mqadmin consumerStatus`` shows it (the consumer's running info): nothing cached, and its consumed
        position at the queue's end — or none, on a queue it started at the end (CONSUME_FROM_LAST_OFFSET
        with no committed offset: nothing to read there)."""
        for c in self.consumers[group]:
            for row in self.broker.consumer_running_info(group, c.client_id)["mqTable"]:
                if row["topic"] != TOPIC:
                    continue
                end = self.broker.get_max_offset(TOPIC, row["queueId"])
                if row["cachedMsgCount"] or row["commitOffset"] not in (end, -1):
                    return False
        return True

    def sweep(self, at_s: float) -> RoundSummary:
        """A sweep round with the sweeper's clock ``at_s`` seconds ahead of now."""
        self.skew_s = at_s
        return self.sweeper.run_once()


def queue_of(rel: Reliability, ids: list[str]) -> dict[str, int | None]:
    with rel.engine.connect() as conn:
        rows = conn.execute(
            select(MessageStub.message_id, MessageStub.queue_id).where(MessageStub.message_id.in_(ids))
        )
        return {m: q for m, q in rows}


def consumer(
    rel: Reliability, broker: Broker, clock: ManualClock, group: str
) -> tuple[PushConsumer, GuardedHandler]:
    def handle(env: Any, session: Any) -> None:  # applied twice = primary-key violation
        session.execute(applied.insert().values(consumer_group=group, message_id=env.message_id))

    c = PushConsumer(
        broker,
        group,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        rebalance_interval_ms=3_600_000,  # the test runs the rebalance ticks (Rig.rebalance)
        clock=clock,
    )
    guard = idempotent_consumer(rel, group=group)(handle)
    c.subscribe(TOPIC, "*", GuardedListener(guard, send_back_to_dlq(c.transport, group)))
    return c.start(), guard


@pytest.fixture
def rig(rel: Reliability, tmp_path: Path) -> Iterator[Rig]:
    clock = ManualClock()
    broker = Broker(
        tmp_path / "store", topics={TOPIC: 4, OTHER: 1}, total_physical_memory_bytes=MEMORY, clock=clock
    ).start()
    producer = Producer(broker, "expansion_p", clock=clock)
    sweep_producer = Producer(broker, "expansion_sweeper", clock=clock)
    started = {g: [consumer(rel, broker, clock, g) for _ in range(2)] for g in GROUPS}
    consumers = {g: [c for c, _ in pairs] for g, pairs in started.items()}
    guards = [guard for pairs in started.values() for _, guard in pairs]
    holder: list[Rig] = []
    sweeper = Sweeper(
        rel,
        BrokerSimSender(sweep_producer),
        probe=BrokerSimProbe(sweep_producer.transport),
        backoff=FixedBackoff((60.0,)),
        stuck_after_s=STUCK_AFTER_S,
        stall_after_s=STALL_AFTER_S,
        max_unconfirmed_age_s=MAX_AGE_S,
        clock=lambda: utcnow() + dt.timedelta(seconds=holder[0].skew_s),
    )
    stubs = StubProducer(rel, BrokerSimSender(producer), default_group=PROMPT)
    r = Rig(rel, clock, broker, producer, stubs, sweeper, consumers, guards)
    holder.append(r)
    try:
        yield r
    finally:
        for cs in consumers.values():
            for c in cs:
                c.shutdown()
        producer.shutdown()
        sweep_producer.shutdown()
        broker.shutdown()


def expand_and_join(rig: Rig) -> tuple[list[str], list[str]]:
    """Traffic on 4 queues, the expansion, messages on the new queues before any group owns them, the prompt
    group's rebalance, heavy traffic elsewhere, the late group's rebalance. Returns (every id so far, the ids
    on the new queues the late group skipped)."""
    before = rig.publish("a", 16)
    wait_until(
        lambda: all(rig.confirmed(g) == 16 for g in GROUPS), timeout=20, what="a-* taken by both groups"
    )
    rig.broker.create_topic(TOPIC, read_queue_nums=8, write_queue_nums=8)  # mqadmin updateTopic -w 8 -r 8
    rig.clock.advance(30)  # the producer's route poll
    wait_until(
        lambda: len(rig.producer.fetch_publish_message_queues(TOPIC)) == 8, timeout=10, what="route poll"
    )
    fresh = rig.publish("c", 16)
    on_new = sorted(m for m, q in queue_of(rig.rel, fresh).items() if q is not None and q >= 4)
    assert len(on_new) == 8, queue_of(rig.rel, fresh)  # 2 on each new queue, nobody owns them yet
    every = before + fresh
    ready = lambda: all(rig.confirmed(g) == len(every) - len(on_new) for g in GROUPS)  # noqa: E731
    wait_until(ready, timeout=20, what="c-* on the old queues taken")
    # the groups have not rebalanced yet (Java: up to 30 s route poll + 20 s tick): waiting, not an alarm
    early = rig.sweep(50)
    assert (early.resent, early.never_consumed, early.stall_alarms) == (0, 0, 0)
    assert rig.broker.query_consumer_offset(PROMPT, TOPIC, 4) == 0  # the first message is in memory
    rig.rebalance(PROMPT)  # so it starts at offset 0 (checkInDiskByConsumeOffset)
    wait_until(lambda: rig.confirmed(PROMPT) == len(every), timeout=20, what="the prompt group reading them")
    for _ in range(30):  # another topic's traffic: the new queues' first messages leave the memory share
        rig.producer.send(Message(topic=OTHER, body=b"y" * 2000))
    assert rig.broker.query_consumer_offset(LATE, TOPIC, 4) is None  # QUERY_NOT_FOUND: from the max offset
    rig.rebalance(LATE)
    return every, on_new


def notices(rel: Reliability) -> list[tuple[str, str]]:
    """The notices a person is told: (group, reason) — not a Redis outage only watched (:data:`TOLD`)."""
    with rel.engine.connect() as conn:
        told = select(StubNotification.consumer_group, StubNotification.reason).where(TOLD)
        rows = conn.execute(told).all()
    return [(g, r) for g, r in rows]


def report(rel: Reliability, tmp_path: Path, ahead_s: float = 0) -> dict[str, Any]:
    """The reconciliation report's per-group figures, as of ``ahead_s`` from now."""
    export_tables(rel.engine, tmp_path / "export")
    as_of = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=ahead_s)
    out: dict[str, Any] = ref.reference_report(
        tmp_path / "export", tmp_path / "out", as_of, grace_s=300, stuck_after_s=STUCK_AFTER_S
    )
    groups: dict[str, Any] = out["groups"]
    return groups


def check_once_each(rig: Rig, every: list[str], tmp_path: Path) -> None:
    """Every message applied once per group, every row CONFIRMED, and the report says so."""
    rig.flush_journals()  # the journal as the report will read it: the duplicates written behind too
    with rig.rel.engine.connect() as conn:
        done = conn.execute(select(applied.c.consumer_group, applied.c.message_id)).all()
        statuses = Counter(conn.execute(select(MessageInbox.status)).scalars())
        deliveries = Counter(conn.execute(select(MessageLog.consumer_group)).scalars())
    for group in GROUPS:  # once per group: a second apply is a primary-key violation
        assert sorted(m for g, m in done if g == group) == sorted(every)
    assert statuses == {StubStatus.CONFIRMED: 2 * len(every)}
    figures = report(rig.rel, tmp_path)
    for group in GROUPS:
        f = figures[group]
        assert {k: f[k] for k in ("confirmed", "pending", "dead", "lost", "stuck", "unsent")} == {
            "confirmed": len(every), "pending": 0, "dead": 0, "lost": 0, "stuck": 0, "unsent": 0
        }  # fmt: skip
        assert f["never_consumed_queues"] == 0
        assert f["deliveries"] == deliveries[group]
        assert sum(f["by_cause"].values()) == deliveries[group] - len(every)  # duplicates, each explained


def test_under_load_the_late_groups_skipped_messages_are_resent_to_it_alone(rig: Rig, tmp_path: Path) -> None:
    every, skipped = expand_and_join(rig)
    more = rig.publish("d", 16)  # load goes on: the late group reads the new queues from here
    every += more
    wait_until(lambda: rig.confirmed(PROMPT) == len(every), timeout=20, what="the prompt group reading d-*")
    missing = len(every) - len(skipped)
    wait_until(lambda: rig.confirmed(LATE) == missing, timeout=20, what="the late group reading d-*")
    assert report(rig.rel, tmp_path / "before", 600)[LATE]["lost"] == len(skipped)  # what the report sees
    first = rig.sweep(
        300
    )  # past the early round's hold; overtaken by the late group's watermark on the new queues: re-sent to it
    assert (first.resent, first.never_consumed, first.stall_alarms) == (len(skipped), 0, 0)
    wait_until(
        lambda: rig.confirmed(LATE) == len(every), timeout=20, what="the late group applying the resends"
    )
    later = rig.sweep(STALL_AFTER_S + STUCK_AFTER_S)  # long after: nothing owed, nobody stalled
    assert (later.resent, later.never_consumed, later.stalled) == (0, 0, 0)
    assert notices(rig.rel) == []
    with rig.rel.engine.connect() as conn:
        retried = conn.execute(
            select(MessageLog.consumer_group, MessageLog.message_id).where(
                MessageLog.topic.startswith("%RETRY%")
            )
        ).all()
    assert sorted(retried) == [(LATE, m) for m in skipped]  # the prompt group got no copy
    check_once_each(rig, every, tmp_path)


def test_on_a_quiet_topic_the_late_groups_skipped_messages_reach_a_person(rig: Rig, tmp_path: Path) -> None:
    every, skipped = expand_and_join(rig)
    wait_until(lambda: rig.confirmed(LATE) == len(every) - len(skipped), timeout=20, what="nothing more")
    held = rig.sweep(STUCK_AFTER_S + 60)  # the copies are older than stuck_after: the group never read there
    assert (held.resent, held.never_consumed, held.stall_alarms) == (0, 4, 0)  # one alarm per queue
    told = [(g, parse_tag(r)) for g, r in notices(rig.rel)]
    assert {g for g, _ in told} == {LATE}  # the prompt group, which read them, is not blamed
    assert sorted(t.queue.queue_id or -1 for _, t in told if t is not None) == [4, 5, 6, 7]
    assert report(rig.rel, tmp_path / "held")[LATE]["never_consumed_queues"] == 4  # the report agrees
    resent = rig.sweep(MAX_AGE_S + 60)  # then re-sent to the group alone (too old)
    assert (resent.resent, resent.stall_alarms) == (len(skipped), 0)
    wait_until(
        lambda: rig.confirmed(LATE) == len(every), timeout=20, what="the late group applying the resends"
    )
    after = rig.sweep(MAX_AGE_S + 2 * STALL_AFTER_S)
    assert (after.resent, after.never_consumed, after.stalled) == (0, 0, 0)
    check_once_each(rig, every, tmp_path)
