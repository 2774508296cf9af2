"""A hung master (SIGSTOP: the kernel still accepts connections, nothing answers, and the name server keeps
listing it until its 120 s expiry) must not stop clients of the other broker groups.

Found by a cluster test: a consumer group started while broker-a's master hung consumed nothing of healthy
broker-b for two minutes — the consumer list of every rebalance was asked of "the first group" (broker-a) and
timed out; a rebalance re-read the route, which listed broker-a again. RocketMQ 4.9.8 asks a broker of the
topic chosen at random (``MQClientInstance.findBrokerAddrByTopic``); broker_sim also falls back to the next
master when the chosen one does not answer. Start-up waited for the hung master's heartbeat reply too.

Each broker is its own process (``ClusterProcess``), so SIGSTOP hangs exactly one master. Requests time out
after 500 ms here (3 s by default) to keep the tests quick.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_sim import ConsumeStatus, Message, Producer, PushConsumer
from broker_sim.common.channels import CheckTransactionStateRequest
from broker_sim.common.message import MessageExt, MessageQueue
from broker_sim.common.requests import ConsumeFromWhere, ExpressionType, HeartbeatData, SubscriptionData
from broker_sim.remoting.client_transport import RemotingTransport
from broker_sim.remoting.cluster_process import ClusterProcess
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
TOPIC = "HungT"
TIMEOUT_MS = 500


@pytest.fixture
def hung_a(tmp_path: Path) -> Iterator[tuple[ClusterProcess, list[bytes]]]:
    """A two-group cluster with 6 messages on broker-b, broker-a's master stopped (SIGSTOP) for the test."""
    config = (f"--set=topics={json.dumps({TOPIC: 2})}", "--set=enable_property_filter=true")
    with ClusterProcess(tmp_path, brokers=2, slaves=0, extra=config) as cluster:
        producer = Producer(cluster.namesrv, "HungPG")
        bodies = [f"b{i}".encode() for i in range(6)]
        try:
            for i, body in enumerate(bodies):
                producer.send(Message(TOPIC, body), queue=MessageQueue(TOPIC, "broker-b", i % 2))
        finally:
            producer.shutdown()
        pid = cluster.node("broker-a").process.proc
        assert pid is not None
        os.kill(pid.pid, signal.SIGSTOP)
        try:
            yield cluster, bodies
        finally:
            os.kill(pid.pid, signal.SIGCONT)


def test_a_group_started_while_another_master_hangs_consumes_the_healthy_group(
    hung_a: tuple[ClusterProcess, list[bytes]],
) -> None:
    cluster, bodies = hung_a
    seen: set[bytes] = set()
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            seen.update(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        RemotingTransport(cluster.namesrv, request_timeout_ms=TIMEOUT_MS),
        "HungCG",
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        rebalance_interval_ms=600_000,  # only the rebalance at start: it must find broker-b's queues
    )
    consumer.subscribe(TOPIC, "*", listener)
    try:
        consumer.start()

        def all_seen() -> bool:
            with lock:
                return seen >= set(bodies)

        assert wait_until(all_seen, timeout=20, what="broker-b's messages consumed while broker-a hangs")
    finally:
        consumer.shutdown()


def test_the_consumer_list_and_the_config_check_fall_back_to_a_master_that_answers(
    hung_a: tuple[ClusterProcess, list[bytes]],
) -> None:
    """Whatever broker the random pick chooses first, the answer comes from one that answers."""
    sql = SubscriptionData(TOPIC, "n < 2", 0, ExpressionType.SQL92)
    for _ in range(4):  # fresh clients: each starts with both masters listed, neither known to have failed
        t = RemotingTransport(cluster_namesrv(hung_a), request_timeout_ms=TIMEOUT_MS)
        try:
            t.check_client_config("HungCG", "c1", sql)
            assert t.get_consumer_list("HungCG", TOPIC) == []
        finally:
            t.close()


def test_a_heartbeat_does_not_wait_for_a_hung_master(hung_a: tuple[ClusterProcess, list[bytes]]) -> None:
    """The heartbeat returns once a master took it (a consumer's start sends one and waited 3 s per hung
    master); the hung master's own request times out in the background."""
    t = RemotingTransport(cluster_namesrv(hung_a), request_timeout_ms=5000)
    try:
        begin = time.monotonic()
        t.heartbeat(HeartbeatData("c1", producer_groups=("HungPG2",)), _NoChannel())
        assert time.monotonic() - begin < 2.5  # the hung master's reply would take the whole 5 s
    finally:
        t.close()


def cluster_namesrv(hung: tuple[ClusterProcess, list[bytes]]) -> str:
    return hung[0].namesrv


class _NoChannel:
    """A client channel nothing calls back on (a producer-only heartbeat)."""

    remote_address = "c1"

    def check_transaction_state(
        self, producer_group: str, request: CheckTransactionStateRequest, message: MessageExt
    ) -> None:
        raise AssertionError("no transaction to check")

    def notify_consumer_ids_changed(self, consumer_group: str) -> None:
        raise AssertionError("no consumer group")
