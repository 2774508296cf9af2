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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, select

from reliable import Reliability
from reliable.models import ConsumeProgress
from reliable.types import StubStatus
from tests.sweeper.helpers import count_stubs as count
from tests.sweeper.helpers import e2e_reliability

pytest.importorskip("broker_sim.broker.broker")

from broker_sim.client.producer import Producer
from broker_sim.client.push_consumer import PushConsumer
from broker_sim.common.requests import ConsumeFromWhere
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

            guarded = idempotent_consumer(rel, group=group)(handle)
            consumer = PushConsumer(
                cluster.namesrv,
                group,
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                pull_time_delay_ms_when_exception=200,
                persist_consumer_offset_interval_ms=500,
            )
            listener = GuardedListener(guarded, send_back_to_dlq(consumer.transport, group))
            consumer.subscribe(TOPIC, "*", listener)
            consumer.start()
            consumers.append(consumer)
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
