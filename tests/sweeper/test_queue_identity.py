"""A queue is (topic, broker group, queue id): on a two-group broker_sim cluster, queue 0 of broker-a and
queue 0 of broker-b have their own watermarks, and the sweeper judges a copy on broker-b by broker-b's
evidence only.

The cluster is real (two brokers and a name server over TCP, in this process); the consumers pull by hand so
the test decides exactly what each group has consumed, and every delivery goes through the guard.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import select

from broker_sim.client.message import Message, MessageQueue
from broker_sim.client.producer import Producer
from broker_sim.client.pull_consumer import PullConsumer
from broker_sim.remoting.serve import BrokerSimServer, ServeConfig
from reliable import Reliability
from reliable.adapters.broker_sim import BrokerSimProbe, BrokerSimSender, to_envelope
from reliable.decorator import idempotent_consumer
from reliable.models import ConsumeProgress, MessageInbox, MessageStub
from reliable.producer import StubProducer
from reliable.sweeper import FixedBackoff, Sweeper, metrics
from reliable.types import ConsumeResult
from tests.clusters import Cluster, ClusterFactory
from tests.clusters import cluster as cluster  # the fixture
from tests.sweeper.helpers import T0, Clock, QueueSender, add_stub, clean, set_inbox, set_progress

TOPIC, GROUPS = "IdT", ("id_g1", "id_g2")
CONFIG: dict[str, Any] = {
    "topics": {TOPIC: 1, **{f"%RETRY%{g}": 1 for g in GROUPS}},
    "flush_interval_commit_log_ms": 3_600_000,  # nothing flushed unless the test flushes: a crash loses it
}


@dataclass
class Pinned:
    """A broker_sim producer whose sends go to one broker group's queue 0 (a RocketMQ queue selector)."""

    producer: Producer
    broker: str

    @property
    def transport(self) -> Any:
        return self.producer.transport

    def send(self, msg: Message) -> Any:
        def pick(mqs: Sequence[MessageQueue], _msg: Message, _arg: Any) -> MessageQueue:
            return next(mq for mq in mqs if mq.broker_name == self.broker and mq.queue_id == 0)

        return self.producer.send(msg, None if msg.topic != TOPIC else pick)


@pytest.fixture
def rel(sqlite_url: str) -> Iterator[Reliability]:
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    r = Reliability(sqlite_url, redis_url="", first_resend_delay_s=0, max_sends=5, stuck_after_s=600)
    clean(r.engine)
    yield r
    r.close()


def publish(rel: Reliability, namesrv: str, broker: str, ids: Sequence[str]) -> None:
    producer = Producer(namesrv, "id_p")
    try:
        stubs = StubProducer(rel, BrokerSimSender(Pinned(producer, broker)), default_group=GROUPS[0])
        with stubs.transaction() as tx:
            for m in ids:
                tx.stage(m, TOPIC, m.encode(), groups=GROUPS)
        assert all(r.receipt is not None for r in tx.results)
    finally:
        producer.shutdown()


def consume(rel: Reliability, namesrv: str, group: str, broker: str, topic: str = TOPIC) -> int:
    """Pull everything of ``broker``'s queue 0 of ``topic`` and hand it to ``group``'s guard."""
    guarded = idempotent_consumer(rel, group=group)(lambda env, session: None)
    consumer = PullConsumer(namesrv, group).start()
    try:
        mq = MessageQueue(topic, broker, 0)
        offset, n = 0, 0
        while True:
            got = consumer.pull(mq, "*", offset)
            if not got.msgs:
                return n
            for msg in got.msgs:
                assert guarded(to_envelope(msg, group)) is ConsumeResult.SUCCESS
                n += 1
            offset = got.next_begin_offset
    finally:
        consumer.shutdown()


def restart_after_power_cut(c: Cluster, name: str) -> None:
    """broker-b loses power (unflushed messages gone) and comes back on the same port."""
    old = c.brokers[name]
    assert old.broker is not None
    old.broker.faults.crash_broker(old.broker)
    port = int(old.broker_address.rsplit(":", 1)[1])
    old.shutdown()
    srv = BrokerSimServer(
        ServeConfig(
            store_dir=c.base / name,
            broker_port=port,
            broker_name=name,
            run_namesrv=False,
            namesrv_addrs=c.namesrv_addrs,
            broker_config=CONFIG,
        )
    )
    srv.start()
    c.brokers[name] = srv


def verdicts() -> dict[str, float]:
    return {v: metrics.VERDICTS.labels(v)._value.get() for v in ("lost", "overtaken", "queued")}


def test_each_broker_groups_queue_0_is_judged_by_its_own_evidence(
    rel: Reliability, cluster: ClusterFactory
) -> None:
    c = cluster(**CONFIG)
    ns = c.namesrv_addrs[0]
    publish(rel, ns, "broker-a", [f"a-{i}" for i in range(10)])  # broker-a queue 0: offsets 0..9
    publish(rel, ns, "broker-b", ["b-0", "b-1"])  # broker-b queue 0: offsets 0..1
    for srv in c.brokers.values():
        assert srv.broker is not None
        srv.broker.store.flush()
    for g in GROUPS:
        assert consume(rel, ns, g, "broker-a") == 10
        assert consume(rel, ns, g, "broker-b") == 2
    with rel.engine.connect() as conn:  # one watermark per broker group's queue 0, per group
        marks = set(
            conn.execute(
                select(
                    ConsumeProgress.consumer_group,
                    ConsumeProgress.broker_name,
                    ConsumeProgress.queue_id,
                    ConsumeProgress.max_offset,
                )
            ).all()
        )
    assert marks == {(g, b, 0, hi) for g in GROUPS for b, hi in (("broker-a", 9), ("broker-b", 1))}

    publish(rel, ns, "broker-b", ["lost-b"])  # broker-b queue 0 offset 2, never flushed …
    restart_after_power_cut(c, "broker-b")  # … and gone
    producer = Producer(ns, "id_sweeper")
    probe = PullConsumer(ns, "id_probe").start()
    try:
        sweeper = Sweeper(
            rel,
            BrokerSimSender(producer),
            probe=BrokerSimProbe(probe.transport),
            backoff=FixedBackoff((3600.0,)),
        )
        before = verdicts()
        assert sweeper.run_once().resent == len(GROUPS)
        after = verdicts()
        # broker-b's own max offset (2) proves the loss; broker-a's queue 0 at 9 is not evidence of anything
        assert after["lost"] - before["lost"] == len(GROUPS)
        assert after["overtaken"] == before["overtaken"]
        with rel.engine.connect() as conn:
            rows = conn.execute(
                select(
                    MessageInbox.consumer_group, MessageInbox.resend_count, MessageInbox.broker_name
                ).where(MessageInbox.message_id == "lost-b")
            ).all()
        assert {(g, n) for g, n, _ in rows} == {(g, 1) for g in GROUPS}
        assert all(b in ("broker-a", "broker-b") for _, _, b in rows)  # where the targeted resend landed

        # a fresh message on broker-b queue 0 (it takes the lost offset 2), not consumed yet: broker-a's
        # queue 0 far ahead (9) must not make it look overtaken, and broker-b has it: it is merely queued
        publish(rel, ns, "broker-b", ["wait-b"])
        with rel.engine.connect() as conn:
            stub = conn.execute(
                select(MessageStub.broker_name, MessageStub.queue_id, MessageStub.queue_offset).where(
                    MessageStub.message_id == "wait-b"
                )
            ).one()
        assert tuple(stub) == ("broker-b", 0, 2)
        before = verdicts()
        assert sweeper.run_once().resent == 0
        after = verdicts()
        assert after["queued"] - before["queued"] == len(GROUPS)
        assert after["lost"] == before["lost"] and after["overtaken"] == before["overtaken"]
    finally:
        probe.shutdown()
        producer.shutdown()

    # the groups consume broker-b (the fresh one) and their retry topics (the resends): nothing is missing
    for g in GROUPS:
        assert consume(rel, ns, g, "broker-b") == 3
        for b in ("broker-a", "broker-b"):
            consume(rel, ns, g, b, topic=f"%RETRY%{g}")
    with rel.engine.connect() as conn:
        open_ = conn.scalars(select(MessageInbox.message_id).where(MessageInbox.status != "CONFIRMED")).all()
    assert open_ == []


# --- an upgrade in place: positions written before migration 0006 have broker_name '' -------------------
class Broker:
    """The broker's max offset per (topic, broker group, queue), as a RocketMQ cluster's probe answers it;
    ``''`` is answered like BrokerSimProbe does: only when exactly one group has that queue id."""

    def __init__(self, ends: dict[tuple[str, str, int], int]) -> None:
        self.ends = ends

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        if broker_name:
            return self.ends.get((topic, broker_name, queue_id))
        found = [v for (t, _, q), v in self.ends.items() if (t, q) == (topic, queue_id)]
        return found[0] if len(found) == 1 else None


class RetryTopicSender(QueueSender):
    """Targeted resends go to the group's retry topic, as RocketMQ's and broker_sim's senders put them."""

    def resend_topic(self, topic: str, group: str) -> str:
        return f"%RETRY%{group}"


def judged(
    rel: Reliability, clock: Clock, probe: Broker, sender: QueueSender | None = None
) -> dict[str, float]:
    before = {v: metrics.VERDICTS.labels(v)._value.get() for v in ("lost", "overtaken", "queued", "too_old")}
    sweeper = Sweeper(rel, sender or QueueSender(), probe=probe, backoff=FixedBackoff((1.0,)), clock=clock,
                      max_unconfirmed_age_s=3 * 3600, stuck_after_s=600)  # fmt: skip
    sweeper.run_once()
    return {v: metrics.VERDICTS.labels(v)._value.get() - n for v, n in before.items()}


CLUSTER = Broker({("orders", "broker-a", 0): 200, ("orders", "broker-b", 0): 9})


def test_a_stub_without_broker_name_on_a_cluster_is_unknown_not_overtaken(
    rel: Reliability, clock: Clock
) -> None:
    """Sent before 0006 (broker ''), consumed since on broker-a's queue 0 far past its offset: that is no
    evidence about broker-b's queue 0, where it may wait. No loss verdict; the age rule decides."""
    add_stub(rel, "old", queue_id=0, queue_offset=5, last_sent_at=T0 - dt.timedelta(hours=1))
    set_progress(rel, 150, broker_name="broker-a")
    set_progress(rel, 3, broker_name="")  # the pre-upgrade watermark (both groups' queue 0 in one row)
    assert judged(rel, clock, CLUSTER) == {"lost": 0, "overtaken": 0, "queued": 1, "too_old": 0}
    clock.advance(3 * 3600)
    assert judged(rel, clock, CLUSTER) == {"lost": 0, "overtaken": 0, "queued": 0, "too_old": 1}


def test_without_broker_groups_the_empty_name_keeps_the_old_rules(rel: Reliability, clock: Clock) -> None:
    """Kafka, RabbitMQ, one broker: every position has '' and a watermark past the copy still proves it
    overtaken, the probe still proves a loss."""
    add_stub(rel, "passed", queue_id=0, queue_offset=5)
    add_stub(rel, "gone", queue_id=1, queue_offset=40)
    set_progress(rel, 9, queue_id=0)
    set_progress(rel, 30, queue_id=1)
    single = Broker({("orders", "", 0): 10, ("orders", "", 1): 31})
    assert judged(rel, clock, single) == {"lost": 1, "overtaken": 1, "queued": 0, "too_old": 0}


def test_a_named_copy_beside_a_pre_upgrade_watermark_is_queued_not_an_alarm(
    rel: Reliability, clock: Clock
) -> None:
    """Sent after the upgrade to broker-b's queue 0; the group's only row there is the '' one from before:
    it has consumed there, so an old copy the broker holds is queued, not a never-consumed alarm, and the
    '' row (which mixed both groups) proves nothing overtaken."""
    add_stub(rel, "new", queue_id=0, queue_offset=7, broker_name="broker-b")
    set_progress(rel, 150, broker_name="")
    assert judged(rel, clock, CLUSTER) == {"lost": 0, "overtaken": 0, "queued": 1, "too_old": 0}
    set_progress(rel, 6, broker_name="broker-b")  # the new guard's watermark of broker-b's queue 0
    add_stub(rel, "gone", queue_id=0, queue_offset=9, broker_name="broker-b")  # broker-b ends at 9: lost
    assert judged(rel, clock, CLUSTER) == {
        "lost": 1,
        "overtaken": 0,
        "queued": 0,
        "too_old": 0,
    }  # "new" waits


def test_a_named_copy_judged_by_an_unnamed_position_only_is_re_sent_once_too_old(
    rel: Reliability, clock: Clock
) -> None:
    """The group consumes through a client that cannot name the broker group (RocketMQ 4.x's): its only
    position on queue 0 is the '' row, mixing both broker groups. A copy on broker-a's queue 0 the broker
    seems to hold is queued — but broker-a may have lost it in a power cut and reused the offset, which no
    position of this group can show. So it is queued only until ``max_unconfirmed_age``, then re-sent as too
    old: held as queued for ever, such a loss would never be re-sent nor anyone told."""
    add_stub(rel, "maybe-lost", queue_id=0, queue_offset=7, broker_name="broker-a", last_sent_at=T0)
    set_progress(rel, 13, broker_name="")
    assert judged(rel, clock, CLUSTER) == {"lost": 0, "overtaken": 0, "queued": 1, "too_old": 0}
    clock.advance(3 * 3600)
    assert judged(rel, clock, CLUSTER) == {"lost": 0, "overtaken": 0, "queued": 0, "too_old": 1}


def test_a_targeted_copy_on_a_retry_topic_nobody_reads_is_re_sent_once_too_old(
    rel: Reliability, clock: Clock
) -> None:
    """The sweeper re-sent the message to ``%RETRY%billing``; the group has no position there (a
    broadcasting group never reads its retry topic; a clustering one may have stopped). Queued at first —
    any clustering consumer of the group reads it —, but not for ever: after ``max_unconfirmed_age`` it is
    re-sent again, so the budget runs out and a person is told, instead of a hold every round."""
    add_stub(rel, "resent", queue_id=0, queue_offset=3, broker_name="broker-a", send_count=2)
    set_inbox(rel, "resent", queue_id=0, queue_offset=4, broker_name="broker-a", updated_at=T0)
    set_progress(rel, 2, broker_name="broker-a")
    probe = Broker({("orders", "broker-a", 0): 3, ("%RETRY%billing", "broker-a", 0): 9})
    sender = RetryTopicSender()
    assert judged(rel, clock, probe, sender) == {"lost": 0, "overtaken": 0, "queued": 1, "too_old": 0}
    clock.advance(3 * 3600)
    assert judged(rel, clock, probe, sender) == {"lost": 0, "overtaken": 0, "queued": 0, "too_old": 1}


def test_a_targeted_copy_behind_the_groups_retry_position_is_not_queued_for_ever(
    rel: Reliability, clock: Clock
) -> None:
    """The group has read its retry topic before (position 2), then stopped; the copy waits at offset 4 and
    the topic is quiet, so no stall alarm (it follows the topic's queues) ever fires. Queued at first, the
    copy is re-sent again after ``max_unconfirmed_age``, so the budget runs out and a person is told."""
    add_stub(rel, "behind", queue_id=0, queue_offset=3, broker_name="broker-a", send_count=2)
    set_inbox(rel, "behind", queue_id=0, queue_offset=4, broker_name="broker-a", updated_at=T0)
    set_progress(rel, 5, broker_name="broker-a")
    set_progress(rel, 2, topic="%RETRY%billing", broker_name="broker-a")
    probe = Broker({("orders", "broker-a", 0): 6, ("%RETRY%billing", "broker-a", 0): 9})
    sender = RetryTopicSender()
    assert judged(rel, clock, probe, sender) == {"lost": 0, "overtaken": 0, "queued": 1, "too_old": 0}
    clock.advance(3 * 3600)
    assert judged(rel, clock, probe, sender) == {"lost": 0, "overtaken": 0, "queued": 0, "too_old": 1}
