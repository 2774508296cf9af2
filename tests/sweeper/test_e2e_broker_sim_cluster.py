"""End to end on a broker_sim cluster: a broker group of a master and a slave, each its own process; the
master loses power (everything unflushed is gone) while stubs are published and guarded consumers run.
Consumers move to the slave, the producer waits for the master, the master comes back with a shorter log
and hands the lost offsets to new messages; sweeps and the guard heal it — every message applied exactly
once (the effects table's primary key would reject a second apply)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, func, select

from reliable import Reliability
from reliable.models import MessageStub
from reliable.types import StubStatus
from tests.sweeper.helpers import clean

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
TOPIC, GROUP = "ClusterE2E", "cluster_e2e_g"
effects = MetaData()
applied = Table("cluster_e2e_applied", effects, Column("message_id", String(64), primary_key=True))


@pytest.fixture
def rel(sqlite_url: str) -> Iterator[Reliability]:
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    r = Reliability(sqlite_url, redis_url="", first_resend_delay_s=0, lease_ms=2000)
    clean(r.engine)
    effects.drop_all(r.engine)
    effects.create_all(r.engine)
    yield r
    r.close()


def count(rel: Reliability, status: StubStatus) -> int:
    with rel.engine.connect() as conn:
        return int(conn.scalar(select(func.count()).where(MessageStub.status == status)) or 0)


def publish(stubs: StubProducer, ids: list[str]) -> int:
    """One stub per message; returns how many sends the broker refused (those stubs stay PENDING)."""
    failed = 0
    for message_id in ids:
        with stubs.transaction() as tx:
            tx.stage(message_id, TOPIC, message_id.encode())
        failed += sum(r.receipt is None for r in tx.results)
    return failed


def test_master_loss_heals_with_zero_lost_and_zero_applied_twice(rel: Reliability, tmp_path: Path) -> None:
    settings = [
        f"--set=topics={json.dumps({TOPIC: 4})}",
        "--set=message_delay_level=" + json.dumps("1s 1s 1s"),
        "--set=flush_interval_commit_log_ms=3600000",  # nothing flushed: the power cut loses it all
    ]
    cluster = ClusterProcess(
        tmp_path / "cluster", brokers=1, slaves=1, replication="async", extra=tuple(settings)
    )
    with cluster:
        producer = Producer(cluster.namesrv, "cluster_e2e_p", retry_times_when_send_failed=0)
        stubs = StubProducer(rel, BrokerSimSender(producer), default_group=GROUP)

        def handle(env: Any, session: Any) -> None:
            session.execute(applied.insert().values(message_id=env.message_id))

        guarded = idempotent_consumer(rel, group=GROUP)(handle)
        consumer = PushConsumer(
            cluster.namesrv,
            GROUP,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            pull_time_delay_ms_when_exception=200,
            persist_consumer_offset_interval_ms=500,
        )
        consumer.subscribe(TOPIC, "*", GuardedListener(guarded, send_back_to_dlq(consumer.transport, GROUP)))
        consumer.start()
        sweeper = Sweeper(
            rel,
            BrokerSimSender(producer),
            probe=BrokerSimProbe(consumer.transport),
            backoff=FixedBackoff((1.0,)),
            max_sends=20,
        )
        ids = [f"m-{i:03d}" for i in range(120)]
        try:
            publish(stubs, ids[:60])
            cluster.power_cut("broker-a")
            assert publish(stubs, ids[60:80]) == 20  # refused: no master; the stubs stay PENDING
            cluster.restart("broker-a")
            publish(stubs, ids[80:])
            deadline = time.monotonic() + 120
            resent = 0
            while count(rel, StubStatus.CONFIRMED) < len(ids):
                assert time.monotonic() < deadline, f"confirmed {count(rel, StubStatus.CONFIRMED)}"
                resent += sweeper.run_once().resent
                threading.Event().wait(0.3)  # the sweeper's own schedule, not synchronisation
        finally:
            consumer.shutdown()
            producer.shutdown()
    assert resent >= 20
    assert count(rel, StubStatus.PENDING) == 0 and count(rel, StubStatus.DEAD) == 0
    with rel.engine.connect() as conn:
        assert sorted(conn.scalars(select(applied.c.message_id))) == ids
