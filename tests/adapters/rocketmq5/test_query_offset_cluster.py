"""QueryOffset on a two-group cluster: each broker has its own 5.x front end, and a message queue is
``(topic, broker name, queue id)``. Asked at broker-a's front end about a queue of broker-b, the answer is
broker-b's (as the 5.x proxy routes it through the name servers), not broker-a's queue of the same id — the
``reliable`` loss probe proves a loss from this number, so the wrong group's would be a false verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from broker_sim.broker.api import SendMessageRequest
from broker_sim.client.message import Prop
from broker_sim.grpc.protocol import load_protocol
from tests.clusters import Cluster, ClusterFactory
from tests.clusters import cluster as cluster  # the fixture

TOPIC = "Orders5"


def send(c: Cluster, broker: str, queue_id: int, count: int) -> None:
    b = c.brokers[broker].broker
    assert b is not None
    for i in range(count):
        key = f"{broker}-{queue_id}-{i}"
        b.send_message(
            SendMessageRequest("p", TOPIC, queue_id, properties={Prop.UNIQ_KEY: key}), key.encode()
        )


@pytest.fixture
def two_groups(rmq5_python: Path, cluster: ClusterFactory) -> Cluster:
    c = cluster(grpc=True, topics={TOPIC: 2})
    send(c, "broker-a", 0, 1)
    send(c, "broker-b", 0, 3)
    send(c, "broker-b", 1, 5)
    return c


class FrontEnd:
    """Raw QueryOffset calls to one broker's 5.x front end."""

    def __init__(self, c: Cluster, broker: str) -> None:
        front = c.brokers[broker].grpc
        assert front is not None
        self.pb = load_protocol()
        self.channel = grpc.insecure_channel(front.address)
        self.stub = self.pb.grpc.MessagingServiceStub(self.channel)

    def query(self, queue_id: int, broker_name: str, policy: str = "END", topic: str = TOPIC) -> Any:
        req = self.pb.service.QueryOffsetRequest()
        req.message_queue.topic.name = topic
        req.message_queue.id = queue_id
        req.message_queue.broker.name = broker_name
        req.query_offset_policy = getattr(self.pb.definition, policy)
        return self.stub.QueryOffset(req, timeout=10)

    def offset(self, queue_id: int, broker_name: str, policy: str = "END") -> int:
        res = self.query(queue_id, broker_name, policy)
        assert res.status.code == self.pb.definition.OK, res.status.message
        return int(res.offset)


def test_query_offset_answers_for_the_broker_group_its_message_queue_names(two_groups: Cluster) -> None:
    front = FrontEnd(two_groups, "broker-a")
    try:
        assert front.offset(0, "broker-a") == 1
        assert front.offset(0, "broker-b") == 3  # broker-b's queue 0, not broker-a's
        assert front.offset(1, "broker-b") == 5
        assert front.offset(1, "broker-a") == 0
        assert front.offset(0, "broker-b", "BEGINNING") == 0
        assert front.offset(0, "") == 1  # no broker name: this front end's own broker (one-broker callers)
    finally:
        front.channel.close()
    back = FrontEnd(two_groups, "broker-b")
    try:
        assert back.offset(0, "broker-a") == 1
        assert back.offset(0, "broker-b") == 3
    finally:
        back.channel.close()


def test_an_unknown_broker_group_or_topic_is_the_proxys_error_not_an_offset(two_groups: Cluster) -> None:
    """The proxy answers BAD_REQUEST "cannot find broker" for a group the topic's route does not have; the
    probe then says "cannot tell" instead of taking some other queue's offset."""
    front = FrontEnd(two_groups, "broker-a")
    d = front.pb.definition
    try:
        res = front.query(0, "broker-z")
        assert (res.status.code, res.status.message) == (d.BAD_REQUEST, "cannot find broker broker-z")
        assert front.query(0, "broker-b", topic="NoSuchTopic").status.code == d.TOPIC_NOT_FOUND
        assert front.query(0, "broker-a", topic="NoSuchTopic").status.code == d.TOPIC_NOT_FOUND
    finally:
        front.channel.close()
