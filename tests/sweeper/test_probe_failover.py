"""The sweeper's broker probe through a master failover, as a team running RocketMQ 4.x with master/slave
broker groups sees it: the probe is the 4.x adapter's (:class:`~reliable.adapters.rocketmq.RocketMQProbe`,
a name-server client of its own that sends nothing and consumes nothing), asked every round while a
master loses power and comes back.

While a master is down the probe reads its slave; once the master is back it must read the master again. A
power cut of a master loses what it had not flushed, which its slave had already copied, so the slave stays
*ahead* of the restarted master and its copy stops there: a probe still reading it answers a max offset that
is no longer the queue's. Until 2026-11-29 it did, for good (nothing made that client ask the name server
again while the slave answered): every message the restarted master stored past the slave's end looked lost,
and a group that was not reading just then (a deploy, a slow consumer) had each of them re-sent round after
round up to its budget, then declared DEAD and a person told — for messages that sat in the master's queue all
along. (ASYNC_MASTER; under SYNC_MASTER the same power cut leaves the slave ahead as well, and every send to
that group then waits out the client's timeout — a broker state an operator repairs, left out here: the
probe's routing is the same code.)

What a user needs: after the master is back, the probe answers the master's offsets; no message the master
holds is re-sent or given up; once the group reads again every message is applied exactly once, nothing
DEAD, no stall notice left open.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, select

from reliable import Reliability
from reliable import constants as C
from reliable.models import MessageInbox, MessageStub, StubNotification
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.types import StubStatus
from tests.sweeper.helpers import TOLD, e2e_reliability
from tests.sweeper.helpers import count_stubs as count
from tests.waiting import wait_until

pytest.importorskip("broker_sim.broker.broker")

from broker_sim.client.producer import Producer
from broker_sim.client.push_consumer import PushConsumer
from broker_sim.common.requests import ConsumeFromWhere
from broker_sim.remoting.client_transport import RemotingTransport
from broker_sim.remoting.cluster_process import ClusterProcess
from reliable.adapters.broker_sim import BrokerSimSender, GuardedListener, send_back_to_dlq
from reliable.adapters.rocketmq import RocketMQProbe
from reliable.decorator import idempotent_consumer
from reliable.producer import StubProducer
from reliable.sweeper import FixedBackoff, Sweeper

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
TOPIC = "ProbeFailover"
GROUP = "pf_group"
effects = MetaData()
applied = Table(
    "probe_failover_applied",
    effects,
    Column("message_id", String(64), primary_key=True),
)


@pytest.fixture
def rel(postgres_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    yield from e2e_reliability(postgres_url, effects, redis_url, key_prefix, lease_ms=C.DEFAULT_LEASE_MS)


class RecordingSender(BrokerSimSender):
    """The sweeper's sender, keeping which messages it re-sent."""

    def __init__(self, producer: Producer) -> None:
        super().__init__(producer)
        self.resent: list[str] = []
        self.lock = threading.Lock()

    def send(self, msg: OutgoingMessage) -> SendReceipt:
        receipt = super().send(msg)
        with self.lock:
            self.resent.append(msg.message_id)
        return receipt


class Rounds:
    """Sweep rounds on a thread until stopped; counts them, keeps any error for the test.

    No round runs while the test publishes (``between``): the fixture makes resends due at once
    (``first_resend_delay_s=0``), so a round during a publish could claim a row whose first send is still
    in flight (committed, no offset recorded yet) and send it again as never sent — a second copy of a
    message the master holds. In production ``first_resend_delay_s`` (60 s) keeps the sweeper off a send
    in flight; here the lock does, and every row is still judged by rounds the moment its send is recorded."""

    def __init__(self, sweeper: Sweeper) -> None:
        self.sweeper = sweeper
        self.done = 0
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.between = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="probe-failover-sweeper", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                with self.between:
                    self.sweeper.run_once()
            except Exception as exc:  # the test fails on it after the run
                self.errors.append(exc)
            self.done += 1
            self.stop.wait(0.2)  # the sweeper's own schedule, not synchronisation

    def __enter__(self) -> Rounds:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def publish(rounds: Rounds, stubs: StubProducer, ids: list[str]) -> None:
    """Stage and send ``ids`` one by one, between sweep rounds (see :class:`Rounds`)."""
    for message_id in ids:
        with rounds.between, stubs.transaction() as tx:
            tx.stage(message_id, TOPIC, message_id.encode(), groups=[GROUP])


def start_consumer(rel: Reliability, namesrv: str) -> PushConsumer:
    def handle(env: Any, session: Any) -> None:
        session.execute(applied.insert().values(message_id=env.message_id))

    c = PushConsumer(
        namesrv,
        GROUP,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        pull_time_delay_ms_when_exception=200,
        persist_consumer_offset_interval_ms=500,
        rebalance_interval_ms=1000,
    )
    c.register_message_listener(
        GuardedListener(idempotent_consumer(rel, group=GROUP)(handle), send_back_to_dlq(c.transport, GROUP))
    )
    c.subscribe(TOPIC, "*")
    return c.start()


def master_max(cluster: ClusterProcess) -> int:
    """broker-a's queue 0 max offset, asked of its master itself."""
    direct = RemotingTransport(cluster.namesrv, request_timeout_ms=2000)
    try:
        direct.locator.directory.update("broker-a", {0: cluster.node("broker-a").address})
        return direct.get_max_offset(TOPIC, 0, "broker-a")
    finally:
        direct.close()


def listed_master(cluster: ClusterProcess) -> bool:
    fresh = RemotingTransport(cluster.namesrv, request_timeout_ms=2000)
    try:
        fresh.locator.refresh()
        return fresh.locator.directory.master("broker-a") == cluster.node("broker-a").address
    finally:
        fresh.close()


def on_broker_a(rel: Reliability, ids: list[str]) -> list[str]:
    with rel.engine.connect() as conn:
        return list(
            conn.execute(
                select(MessageStub.message_id).where(
                    MessageStub.message_id.in_(ids), MessageStub.broker_name == "broker-a"
                )
            ).scalars()
        )


def queued_for_the_group(rel: Reliability, ids: list[str], position: int) -> set[str]:
    """Of ``ids``, those on broker-b and those broker-a stored at or past ``position``."""
    with rel.engine.connect() as conn:
        rows = conn.execute(
            select(MessageStub.message_id, MessageStub.broker_name, MessageStub.queue_offset).where(
                MessageStub.message_id.in_(ids)
            )
        ).all()
    return {
        m for m, b, o in rows if o is not None and (b == "broker-b" or (b == "broker-a" and o >= position))
    }


def confirmed(rel: Reliability, ids: list[str]) -> bool:
    with rel.engine.connect() as conn:
        rows = conn.execute(
            select(MessageInbox.message_id).where(
                MessageInbox.message_id.in_(ids), MessageInbox.status == StubStatus.CONFIRMED
            )
        ).all()
    return len(rows) == len(ids)


def test_probe_reads_the_master_again_once_it_is_back_and_nothing_it_holds_is_resent(
    rel: Reliability, tmp_path: Path
) -> None:
    settings = (
        f"--set=topics={json.dumps({TOPIC: 1})}",
        "--set=flush_interval_commit_log_ms=3600000",  # nothing flushed: the power cut loses it all
    )
    cluster = ClusterProcess(tmp_path / "cluster", brokers=2, slaves=1, replication="async", extra=settings)
    before, backlog, during, after = (
        [f"pf-{phase}-{i:03d}" for i in range(n)] for phase, n in (("b", 12), ("q", 6), ("d", 6), ("a", 30))
    )
    everything = before + backlog + during + after
    with cluster:
        producer = Producer(cluster.namesrv, "pf_producer")
        stubs = StubProducer(rel, BrokerSimSender(producer), default_group=GROUP)
        sender = RecordingSender(producer)
        probe = RocketMQProbe(cluster.namesrv, timeout_ms=2000)
        sweeper = Sweeper(
            rel, sender, probe=probe, backoff=FixedBackoff((0.5,)), max_sends=10, stall_after_s=60
        )
        consumer = start_consumer(rel, cluster.namesrv)
        try:
            with Rounds(sweeper) as rounds:
                publish(rounds, stubs, before)
                assert wait_until(lambda: confirmed(rel, before), timeout=30, what="the first batch applied")
                position = len(on_broker_a(rel, before))  # where the group stands on broker-a's queue
                consumer.shutdown()  # the group stops reading for a while (a deploy)
                publish(rounds, stubs, backlog)  # pending: the sweeper probes their queues every round
                cluster.power_cut("broker-a")
                # the probe meets the dead master, then reads its slave
                seen = rounds.done
                assert wait_until(lambda: rounds.done >= seen + 3, timeout=30, what="rounds while down")
                publish(rounds, stubs, during)  # to broker-b (the producer avoids the dead group)
                cluster.restart("broker-a")
                assert wait_until(lambda: listed_master(cluster), timeout=30, what="broker-a's master listed")
                resent_before = len(sender.resent)
                publish(rounds, stubs, after)
                seen = rounds.done
                assert wait_until(lambda: rounds.done >= seen + 8, timeout=30, what="rounds after the return")
                # each of these the master holds; those it stored at or past the group's position there
                # (lower ones reuse offsets the group already passed: rightly re-sent as overtaken) and
                # those on broker-b are queued for the group: none of them is re-sent
                queued = queued_for_the_group(rel, after, position)
                assert len(queued) >= 10
                assert sorted(set(sender.resent[resent_before:]) & queued) == []
                # the probe answers the master's end of the queue, not the slave's stale copy
                assert probe.max_offset(TOPIC, 0, "broker-a") == master_max(cluster)
                consumer = start_consumer(rel, cluster.namesrv)
                assert wait_until(lambda: confirmed(rel, everything), timeout=30, what="all applied")
            assert not rounds.errors, rounds.errors
        finally:
            consumer.shutdown()
            producer.shutdown()
            probe.close()
    assert count(rel, StubStatus.CONFIRMED) == len(everything)
    with rel.engine.connect() as conn:
        done = conn.execute(select(applied.c.message_id)).scalars().all()
        notices = conn.execute(select(StubNotification.message_id, StubNotification.reason).where(TOLD)).all()
    assert sorted(done) == sorted(everything)  # once each: a second apply is a primary-key violation
    assert [n for n in notices if n.message_id.startswith(C.STALL_KEY_PREFIX)] == []
    assert notices == []  # no give-up, no stall notice left open
