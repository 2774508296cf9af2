"""End to end on a broker_sim cluster of two broker groups, each a master and a slave in its own process;
broker-a's master loses power (everything unflushed is gone) while stubs are published and two consumer
groups' guarded consumers run. Consumers read broker-a from its slave, the producer moves to broker-b or
is refused, the master comes back with a shorter log and hands the lost offsets to new messages; sweeps and
the guard heal it — every message applied exactly once per group (the effects table's primary key would
reject a second apply). Both groups have a queue 0 on each broker group: the watermarks, the sweeper's
verdicts and the probe are per (topic, broker group, queue)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, select

from reliable import Reliability
from reliable.models import ConsumeProgress, MessageLog
from reliable.types import LogOutcome, StubStatus
from tests.sweeper.helpers import count_stubs as count
from tests.sweeper.helpers import e2e_reliability
from tests.waiting import wait_until

pytest.importorskip("broker_sim.broker.broker")

from broker_sim.client.producer import Producer
from broker_sim.client.push_consumer import PushConsumer
from broker_sim.common.requests import ConsumeFromWhere
from broker_sim.remoting.client_transport import RemotingTransport
from broker_sim.remoting.cluster_process import ClusterProcess
from reliable.adapters.broker_sim import BrokerSimProbe, BrokerSimSender, GuardedListener, send_back_to_dlq
from reliable.decorator import idempotent_consumer
from reliable.producer import StubProducer
from reliable.sweeper import FixedBackoff, Sweeper

pytestmark = pytest.mark.slow
TOPIC, GROUPS = "ClusterE2E", ("cluster_e2e_g1", "cluster_e2e_g2")
effects = MetaData()
applied = Table(
    "cluster_e2e_applied",
    effects,
    Column("consumer_group", String(64), primary_key=True),
    Column("message_id", String(64), primary_key=True),
)


@pytest.fixture
def rel(sqlite_url: str) -> Iterator[Reliability]:
    yield from e2e_reliability(sqlite_url, effects)


def publish(stubs: StubProducer, ids: list[str]) -> int:
    """One stub per message for both groups; returns how many sends the broker refused (PENDING stubs)."""
    failed = 0
    for message_id in ids:
        with stubs.transaction() as tx:
            tx.stage(message_id, TOPIC, message_id.encode(), groups=GROUPS)
        failed += sum(r.receipt is None for r in tx.results)
    return failed


def guarded_consumer(
    rel: Reliability, cluster: ClusterProcess, group: str, handle: Callable[[Any, Any], None]
) -> PushConsumer:
    """A started push consumer of ``group`` on TOPIC whose listener is ``handle`` under the guard."""
    guarded = idempotent_consumer(rel, group=group)(handle)
    consumer = PushConsumer(
        cluster.namesrv,
        group,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        pull_time_delay_ms_when_exception=200,
        persist_consumer_offset_interval_ms=500,
    )
    consumer.subscribe(TOPIC, "*", GuardedListener(guarded, send_back_to_dlq(consumer.transport, group)))
    return consumer.start()


def test_master_loss_on_two_groups_heals_with_zero_lost_and_zero_applied_twice(
    rel: Reliability, tmp_path: Path
) -> None:
    settings = [
        f"--set=topics={json.dumps({TOPIC: 2})}",
        "--set=message_delay_level=" + json.dumps("1s 1s 1s"),
        "--set=flush_interval_commit_log_ms=3600000",  # nothing flushed: the power cut loses it all
    ]
    cluster = ClusterProcess(
        tmp_path / "cluster", brokers=2, slaves=1, replication="async", extra=tuple(settings)
    )
    with cluster:
        producer = Producer(cluster.namesrv, "cluster_e2e_p", retry_times_when_send_failed=0)
        stubs = StubProducer(rel, BrokerSimSender(producer), default_group=GROUPS[0])
        consumers = []
        for group in GROUPS:

            def handle(env: Any, session: Any, group: str = group) -> None:
                session.execute(applied.insert().values(consumer_group=group, message_id=env.message_id))

            consumers.append(guarded_consumer(rel, cluster, group, handle))
        sweeper = Sweeper(
            rel,
            BrokerSimSender(producer),
            probe=BrokerSimProbe(consumers[0].transport),
            backoff=FixedBackoff((1.0,)),
            max_sends=20,
        )
        ids = [f"m-{i:03d}" for i in range(120)]
        try:
            publish(stubs, ids[:60])
            cluster.power_cut("broker-a")
            publish(stubs, ids[60:80])  # to broker-b, or refused (PENDING: the sweeper sends it)
            cluster.restart("broker-a")
            publish(stubs, ids[80:])
            deadline = time.monotonic() + 120
            while count(rel, StubStatus.CONFIRMED) < len(ids):
                assert time.monotonic() < deadline, f"confirmed {count(rel, StubStatus.CONFIRMED)}"
                sweeper.run_once()
                threading.Event().wait(0.3)  # the sweeper's own schedule, not synchronisation
        finally:
            for consumer in consumers:
                consumer.shutdown()
            producer.shutdown()
    assert count(rel, StubStatus.PENDING) == 0 and count(rel, StubStatus.DEAD) == 0
    with rel.engine.connect() as conn:
        done = conn.execute(select(applied.c.consumer_group, applied.c.message_id)).all()
        marks = set(conn.execute(select(ConsumeProgress.consumer_group, ConsumeProgress.broker_name)).all())
    for group in GROUPS:  # every message applied once per group (a second apply is a primary-key violation)
        assert sorted(m for g, m in done if g == group) == ids
        assert {(group, "broker-a"), (group, "broker-b")} <= marks  # one watermark per broker group


def test_a_handler_failing_while_its_master_is_down_is_retried_through_the_other_master(
    rel: Reliability, tmp_path: Path
) -> None:
    """broker-a's master is down and the groups read its queues from the slave. The first group's handler
    fails the first attempt of every message. For a message of broker-a the send back to its master cannot be
    made, so the client sends the retry copy to the group's retry topic itself, and it lands on broker-b.
    What the groups need: every message applied once per group while the master is still down, the retry
    journaled where it was delivered (``%RETRY%{group}`` on broker-b, business topic kept), and the other
    group untouched by the first one's retries."""
    settings = [
        f"--set=topics={json.dumps({TOPIC: 2})}",
        "--set=message_delay_level=" + json.dumps(" ".join(["1s"] * 18)),
    ]
    cluster = ClusterProcess(
        tmp_path / "cluster",
        brokers=2,
        slaves=1,
        replication="sync",
        flush="SYNC_FLUSH",
        extra=tuple(settings),
    )
    attempts: dict[str, int] = {}
    lock = threading.Lock()
    failing = GROUPS[0]
    with cluster:
        producer = Producer(cluster.namesrv, "cluster_e2e_p")
        stubs = StubProducer(rel, BrokerSimSender(producer), default_group=failing)
        ids = [f"f-{i:03d}" for i in range(24)]
        assert publish(stubs, ids) == 0
        producer.shutdown()
        cluster.power_cut("broker-a")
        probe = RemotingTransport(cluster.namesrv)

        def master_gone() -> bool:
            probe.locator.refresh()
            return probe.locator.directory.master("broker-a") is None

        assert wait_until(master_gone, timeout=60, what="broker-a's master out of the route")
        consumers = []
        for group in GROUPS:

            def handle(env: Any, session: Any, group: str = group) -> None:
                if group == failing:
                    with lock:
                        attempts[env.message_id] = attempts.get(env.message_id, 0) + 1
                        if attempts[env.message_id] == 1:
                            raise RuntimeError("first attempt fails")
                session.execute(applied.insert().values(consumer_group=group, message_id=env.message_id))

            consumers.append(guarded_consumer(rel, cluster, group, handle))
        try:
            confirmed = lambda: count(rel, StubStatus.CONFIRMED) == len(ids)  # noqa: E731
            assert wait_until(confirmed, timeout=60, what="every message confirmed by both groups")
            assert probe.locator.directory.master("broker-a") is None
        finally:
            for consumer in consumers:
                consumer.shutdown()
            probe.close()
    with rel.engine.connect() as conn:
        done = conn.execute(select(applied.c.consumer_group, applied.c.message_id)).all()
        log = conn.execute(
            select(
                MessageLog.consumer_group,
                MessageLog.message_id,
                MessageLog.topic,
                MessageLog.broker_name,
                MessageLog.original_topic,
                MessageLog.outcome,
            ).order_by(MessageLog.id)
        ).all()
    for group in GROUPS:  # once per group (a second apply is a primary-key violation)
        assert sorted(m for g, m in done if g == group) == ids
    assert attempts == dict.fromkeys(ids, 2)
    journal: dict[tuple[str, str], list[tuple[str, str, str | None, LogOutcome | None]]] = {}
    for group, message_id, topic, broker, original, outcome in log:
        journal.setdefault((group, message_id), []).append((topic, broker, original, outcome))
    first_of_a = [m for m in ids if journal[(failing, m)][0][1] == "broker-a"]
    assert first_of_a, "no message of broker-a reached the failing group"
    for m in first_of_a:
        failed, retried = journal[(failing, m)]
        assert failed == (TOPIC, "broker-a", TOPIC, LogOutcome.RETRY)
        assert retried == (f"%RETRY%{failing}", "broker-b", TOPIC, LogOutcome.SUCCESS)
    for m in ids:  # the other group: one delivery each, from the topic itself
        ((topic, _broker, _original, outcome),) = journal[(GROUPS[1], m)]
        assert (topic, outcome) == (TOPIC, LogOutcome.SUCCESS)
