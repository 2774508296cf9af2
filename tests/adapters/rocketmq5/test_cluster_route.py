"""A 5.x client on a cluster of two broker groups, each with its own 5.x front end.

What a 5.x user needs: whichever endpoint the client is given, it sees the topic's whole route (every group's
message queues, each at the endpoints of the front end serving that group) and a push consumer is assigned
every group, so messages stored on either group are consumed — none is stranded on the group the client
was not pointed at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker_sim.broker.api import SendMessageRequest
from broker_sim.client.message import Prop
from broker_sim.common.net import local_address
from broker_sim.grpc.protocol import load_protocol
from tests.adapters.rocketmq5.conftest import Client5
from tests.clusters import Cluster, ClusterFactory
from tests.clusters import cluster as cluster  # the fixture
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOPIC = "Routed5"
GROUPS = ("broker-a", "broker-b")


def endpoint(c: Cluster, broker: str) -> str:
    front = c.brokers[broker].grpc
    assert front is not None
    return front.address


def send(c: Cluster, broker: str, queue_id: int, count: int) -> set[str]:
    b = c.brokers[broker].broker
    assert b is not None
    bodies = set()
    for i in range(count):
        body = f"{broker}-{queue_id}-{i}"
        b.send_message(
            SendMessageRequest("p", TOPIC, queue_id, properties={Prop.UNIQ_KEY: body}), body.encode()
        )
        bodies.add(body)
    return bodies


@pytest.fixture
def two_groups(rmq5_python: Path, cluster: ClusterFactory) -> Cluster:
    return cluster(grpc=True, topics={TOPIC: 2})


def ask(c: Cluster, broker: str, rpc: str, topic: str = TOPIC) -> Any:
    """A raw QueryRoute / QueryAssignment at ``broker``'s front end, as a 5.x client sends it."""
    pb = load_protocol()
    host, port = endpoint(c, broker).rsplit(":", 1)
    req = getattr(pb.service, f"{rpc}Request")()
    req.topic.name = topic
    req.endpoints.scheme = pb.definition.IPv4
    req.endpoints.addresses.add(host=host, port=int(port))
    if rpc == "QueryAssignment":
        req.group.name = "G"
    with grpc.insecure_channel(endpoint(c, broker)) as channel:
        resp = getattr(pb.grpc.MessagingServiceStub(channel), rpc)(req, timeout=10)
    assert resp.status.code == pb.definition.OK, resp.status.message
    return resp


def where(mq: Any) -> tuple[str, int, str]:
    addr = mq.broker.endpoints.addresses[0]
    return mq.broker.name, mq.id, f"{addr.host}:{addr.port}"


def test_every_front_end_routes_every_groups_queues_to_that_groups_endpoint(two_groups: Cluster) -> None:
    a, b = endpoint(two_groups, "broker-a"), endpoint(two_groups, "broker-b")
    expected = {("broker-a", 0, a), ("broker-a", 1, a), ("broker-b", 0, b), ("broker-b", 1, b)}
    for asked in GROUPS:
        route = ask(two_groups, asked, "QueryRoute")
        assert sorted(where(mq) for mq in route.message_queues) == sorted(expected)
        assignments = ask(two_groups, asked, "QueryAssignment").assignments
        assert sorted(where(x.message_queue) for x in assignments) == [
            ("broker-a", -1, a),
            ("broker-b", -1, b),
        ]


def consumed(client: Client5, expected: set[str]) -> set[str]:
    got: set[str] = set()

    def more() -> bool:
        for m in client.call("receive", max=32, invisible_s=30)["messages"]:
            got.add(m["body"])
            client.call("ack", handle=m["handle"])
        return got >= expected

    wait_until(more, what=f"{len(expected)} messages from both groups")
    return got


def sent_to_both(c: Cluster) -> set[str]:
    return send(c, "broker-a", 0, 2) | send(c, "broker-b", 1, 3) | send(c, "broker-b", 0, 1)


@pytest.fixture
def client_at(two_groups: Cluster, rmq5_python: Path, tmp_path: Path) -> Iterator[Callable[[str], Client5]]:
    """An official 5.x client given one broker's front end as its only endpoint."""
    made: list[Client5] = []

    def make(broker: str) -> Client5:
        made.append(Client5(rmq5_python, endpoint(two_groups, broker), tmp_path))
        return made[-1]

    yield make
    for c in made:
        c.close()


def test_a_simple_consumer_given_one_endpoint_consumes_both_groups(
    two_groups: Cluster, client_at: Callable[[str], Client5]
) -> None:
    sent = sent_to_both(two_groups)
    client = client_at("broker-a")
    client.call("simple", group="S1", topic=TOPIC, await_s=1)
    assert consumed(client, sent) == sent


def test_a_push_consumer_given_one_endpoint_consumes_both_groups(
    two_groups: Cluster, client_at: Callable[[str], Client5]
) -> None:
    sent = sent_to_both(two_groups)
    client = client_at("broker-b")
    got: set[str] = set()

    def everything() -> bool:
        got.update(e["body"] for e in client.call("events")["events"] if e["event"] == "push")
        return got >= sent

    client.call("push", group="P1", topic=TOPIC)
    wait_until(everything, what=f"{len(sent)} push deliveries from both groups")
    assert got == sent


def test_a_producer_given_one_endpoint_spreads_sends_over_both_groups(
    two_groups: Cluster, client_at: Callable[[str], Client5]
) -> None:
    producer, consumer = client_at("broker-a"), client_at("broker-b")
    producer.call("producer", topics=[TOPIC])
    sent = {f"p{i}" for i in range(4)}
    for body in sorted(sent):
        producer.call("send", topic=TOPIC, body=body)
    for name in GROUPS:  # round robin over the 4 writable queues of the route: 2 on each group
        b = two_groups.brokers[name].broker
        assert b is not None
        assert sum(b.get_max_offset(TOPIC, q) for q in (0, 1)) == 2, name
    consumer.call("simple", group="S2", topic=TOPIC, await_s=1)
    assert consumed(consumer, sent) == sent


def test_the_route_leaves_out_a_group_without_a_front_end_and_finds_a_topic_only_another_group_has(
    rmq5_python: Path, cluster: ClusterFactory
) -> None:
    c = cluster(brokers=())
    c.add_broker("broker-a", grpc=True, topics={TOPIC: 2})
    c.add_broker("broker-b", grpc=True, topics={TOPIC: 2})
    c.add_broker("broker-c", topics={TOPIC: 2})  # 4.x only: a 5.x client could not reach it
    only_b = c.brokers["broker-b"].broker
    assert only_b is not None
    only_b.create_topic("OnlyB5", 1)
    a, b = endpoint(c, "broker-a"), endpoint(c, "broker-b")
    both = [("broker-a", 0, a), ("broker-a", 1, a), ("broker-b", 0, b), ("broker-b", 1, b)]
    assert sorted(where(mq) for mq in ask(c, "broker-a", "QueryRoute").message_queues) == both
    routed = ask(c, "broker-a", "QueryRoute", "OnlyB5").message_queues
    assert [where(mq) for mq in routed] == [("broker-b", 0, b)]
    assigned = ask(c, "broker-a", "QueryAssignment", "OnlyB5").assignments
    assert [where(x.message_queue) for x in assigned] == [("broker-b", -1, b)]


def test_front_ends_bound_to_all_interfaces_route_clients_to_reachable_endpoints(
    rmq5_python: Path, cluster: ClusterFactory, tmp_path: Path
) -> None:
    """Every server bound to 0.0.0.0 (a container's usual setting): the route lists each group at this
    machine's address — never 0.0.0.0, which no other machine can connect to — and a client given one
    endpoint consumes from both groups through what the route told it."""
    c = cluster(grpc=True, topics={TOPIC: 2}, host="0.0.0.0")
    here = local_address()
    route = ask(c, "broker-a", "QueryRoute")
    assert {where(mq)[0] for mq in route.message_queues} == set(GROUPS)
    assert {where(mq)[2].rpartition(":")[0] for mq in route.message_queues} == {here}
    sent = sent_to_both(c)
    client = Client5(rmq5_python, endpoint(c, "broker-a"), tmp_path)
    try:
        client.call("simple", group="S0", topic=TOPIC, await_s=1)
        assert consumed(client, sent) == sent
    finally:
        client.close()
