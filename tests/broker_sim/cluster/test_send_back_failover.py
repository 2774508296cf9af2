"""A message the listener fails on while its master is down (RocketMQ 4.9.8
``DefaultMQPushConsumerImpl.sendMessageBack``): the group reads the queue from the slave, the send back to
the master cannot be made, and the client sends the retry copy to ``%RETRY%{group}`` itself — it lands on a
master that is up. What the group needs: the message is delivered again, as a retry of the original, and it
no longer holds the queue it came from, so the group's offsets there move on while the master is away. A
second group on the topic, whose listener succeeds, gets each message once: the copy is the failing group's
alone.

Before the client sent copies itself, such a message was retried in the consumer's memory every 5 s until
the master came back, holding the queue's offset; a consumer that stopped in between left it to be consumed
again from the slave's offset.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker_sim import ConsumeStatus, Message, Producer, PullConsumer, PushConsumer
from broker_sim.common.errors import TransportError
from broker_sim.common.message import MessageExt, MessageQueue, Prop
from broker_sim.common.requests import ConsumeFromWhere
from broker_sim.faults import FaultInjector
from broker_sim.remoting.client_transport import RemotingTransport
from broker_sim.remoting.cluster_process import ClusterProcess
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
TOPIC = "FailoverT"
GROUP = "FailoverCG"
#: every delay level one second, so a retry copy is due soon
LEVELS = " ".join(["1s"] * 18)


@dataclass(frozen=True)
class Delivery:
    msg_id: str
    broker_name: str
    topic: str
    reconsume_times: int
    retry_topic: str | None
    origin_id: str | None


class FailFirst:
    """Fails the first delivery of each message stored on broker-a; records every delivery."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[bytes, list[Delivery]] = {}

    def listener(self, msgs: list[MessageExt]) -> ConsumeStatus:
        status = ConsumeStatus.CONSUME_SUCCESS
        with self.lock:
            for m in msgs:
                got = self.seen.setdefault(m.body, [])
                got.append(
                    Delivery(
                        m.msg_id,
                        m.broker_name or "",
                        m.topic,
                        m.reconsume_times,
                        m.properties.get(Prop.RETRY_TOPIC),
                        m.properties.get(Prop.ORIGIN_MESSAGE_ID),
                    )
                )
                if len(got) == 1 and m.broker_name == "broker-a":
                    status = ConsumeStatus.RECONSUME_LATER
        return status

    def deliveries(self, body: bytes) -> list[Delivery]:
        with self.lock:
            return list(self.seen.get(body, []))


def lose_broker_a(cluster: ClusterProcess, probe: RemotingTransport) -> None:
    """Cut broker-a's master's power and wait until the name server no longer lists it."""
    FaultInjector().lose_master(cluster, "broker-a")

    def master_gone() -> bool:
        probe.locator.refresh()
        return probe.locator.directory.master("broker-a") is None

    assert wait_until(master_gone, timeout=60, what="broker-a's master out of the route")


def test_a_failed_message_is_retried_through_another_master_while_its_own_is_down(tmp_path: Path) -> None:
    cluster = ClusterProcess(
        tmp_path,
        brokers=2,
        slaves=1,
        replication="sync",  # what was acknowledged is on the slave
        flush="SYNC_FLUSH",
        extra=(f"--set=topics={json.dumps({TOPIC: 2})}", f"--set=message_delay_level={LEVELS}"),
    )
    listener = FailFirst()
    other: dict[bytes, int] = {}
    other_lock = threading.Lock()

    def other_listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with other_lock:
            for m in msgs:
                other[m.body] = other.get(m.body, 0) + 1
        return ConsumeStatus.CONSUME_SUCCESS

    with cluster:
        probe = RemotingTransport(cluster.namesrv)
        producer = Producer(cluster.namesrv, "FailoverPG")
        consumers: list[PushConsumer] = []
        try:
            on_a = [f"a{i}".encode() for i in range(8)]
            for i, body in enumerate(on_a):
                producer.send(Message(TOPIC, body), queue=MessageQueue(TOPIC, "broker-a", i % 2))
            producer.shutdown()
            lose_broker_a(cluster, probe)
            slave_max = {q: probe.get_max_offset(TOPIC, q, "broker-a") for q in range(2)}
            assert sum(slave_max.values()) == len(on_a)

            for group, listen in ((GROUP, listener.listener), ("FailoverOtherCG", other_listener)):
                consumer = PushConsumer(
                    cluster.namesrv,
                    group,
                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                    persist_consumer_offset_interval_ms=500,
                )
                consumer.subscribe(TOPIC, "*", listen)
                consumers.append(consumer.start())

            def retried(body: bytes) -> bool:
                return len(listener.deliveries(body)) >= 2

            assert wait_until(lambda: all(map(retried, on_a)), timeout=60, what="every failed message again")
            for body in on_a:
                first, again, *more = listener.deliveries(body)
                assert not more, f"{body!r} delivered {2 + len(more)} times"
                assert (first.broker_name, first.reconsume_times) == ("broker-a", 0)
                # the copy came from the group's retry topic on the master that is up, as a retry of the
                # original: the listener sees the original topic, and the origin's id
                assert again.broker_name == "broker-b", body
                assert (again.topic, again.retry_topic, again.reconsume_times) == (TOPIC, TOPIC, 1)
                assert again.origin_id == first.msg_id

            def offsets_moved_on() -> bool:
                for c in consumers:
                    c.persist_offsets()
                return all(
                    (probe.query_consumer_offset(c.group, TOPIC, q, "broker-a") or 0) == slave_max[q]
                    for c in consumers
                    for q in range(2)
                )

            # nothing of broker-a's queues is held in either consumer while its master is down
            assert wait_until(offsets_moved_on, timeout=30, what="both groups' offsets at the slave's max")
            assert probe.locator.directory.master("broker-a") is None
            with other_lock:
                assert other == dict.fromkeys(on_a, 1)
        finally:
            for c in consumers:
                c.shutdown()
            probe.close()


def test_a_pull_consumer_sends_its_retry_copy_to_another_master_while_its_own_is_down(tmp_path: Path) -> None:
    """DefaultMQPullConsumerImpl.sendMessageBack (4.9.8) falls back the same way: the copy lands on the
    group's retry topic of the master that is up, and the call returns."""
    cluster = ClusterProcess(
        tmp_path,
        brokers=2,
        slaves=1,
        replication="sync",
        flush="SYNC_FLUSH",
        extra=(f"--set=topics={json.dumps({TOPIC: 1})}", f"--set=message_delay_level={LEVELS}"),
    )
    with cluster:
        probe = RemotingTransport(cluster.namesrv)
        producer = Producer(cluster.namesrv, "FailoverPG")
        consumer = PullConsumer(cluster.namesrv, "FailoverPullCG")
        try:
            producer.send(Message(TOPIC, b"pulled"), queue=MessageQueue(TOPIC, "broker-a", 0))
            producer.shutdown()
            consumer.start()
            lose_broker_a(cluster, probe)

            def pulled() -> list[MessageExt]:
                try:  # the first pull may still go to the dead master, which makes the client look again
                    return consumer.pull(MessageQueue(TOPIC, "broker-a", 0), "*", 0).msgs
                except TransportError:
                    return []

            (msg,) = wait_until(pulled, timeout=30, what="the message pulled from broker-a's slave")
            consumer.send_message_back(msg)

            def copy_on_b() -> bool:
                return probe.get_max_offset("%RETRY%FailoverPullCG", 0, "broker-b") == 1

            assert wait_until(
                copy_on_b, timeout=30, what="the retry copy on broker-b's %RETRY%FailoverPullCG"
            )
        finally:
            consumer.shutdown()
            probe.close()
