"""Which broker group and queue a 4.x send landed on, told from the C++ client's selector index.

0.4.4 reports neither the queue nor the broker of a send, only the index its selector chose in the client's
publish list. A receipt naming the wrong (broker group, queue) makes the sweeper compare the offset with
another queue's watermark, so the mapping must follow the client's list exactly: in the order the client
builds it whatever order the name server sends the queue data in, and for the attempt that was stored.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker_sim.broker.api import SendMessageRequest
from broker_sim.client.message import Prop
from broker_sim.common.requests import TopicRouteData
from broker_sim.remoting.client_transport import RemotingTransport
from reliable.adapters.rocketmq import QueueBook, RocketMQSender
from reliable.sender import OutgoingMessage
from tests.clusters import ClusterFactory
from tests.clusters import cluster as cluster  # the fixture

TOPIC = "RmqRouteT"


def mapped(book: QueueBook, size: int) -> list[tuple[str, int]]:
    return [book.sent_to(TOPIC, i, size) for i in range(size)]


def answering(route: TopicRouteData) -> QueueBook:
    """A book whose name server answers ``route`` for every topic."""
    return QueueBook(lambda _topic: route)


def test_the_index_maps_through_the_clients_order_whatever_order_the_route_comes_in(
    cluster: ClusterFactory,
) -> None:
    c = cluster(topics={TOPIC: 2})
    transport = RemotingTransport(c.namesrv_addrs[0])
    try:
        route = transport.get_route(TOPIC)
    finally:
        transport.close()
    by_name = [("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1)]
    reordered = replace(route, queue_datas=route.queue_datas[::-1], broker_datas=route.broker_datas[::-1])
    for r in (route, reordered):  # the client sorts the queue data by broker name
        assert mapped(answering(r), 4) == by_name
    # a name server with ORDER_TOPIC_CONFIG for the topic: the client's list follows orderTopicConf as given
    ordered = replace(route, order_topic_conf="broker-b:2;broker-a:2")
    assert mapped(answering(ordered), 4) == by_name[2:] + by_name[:2]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_send_retried_after_a_lost_ack_names_the_queue_it_was_stored_on(cluster: ClusterFactory) -> None:
    """The C++ client's own retry moves to another group's queue without asking the selector; the receipt
    must still name the (group, queue, offset) that holds the message."""
    c = cluster(topics={TOPIC: 2})
    a, b = c.brokers["broker-a"].broker, c.brokers["broker-b"].broker
    assert a is not None and b is not None
    for i in range(3):  # broker-b's queue 0 at offset 3, broker-a's queues empty: offsets tell them apart
        b.send_message(SendMessageRequest("p", TOPIC, 0, properties={Prop.UNIQ_KEY: f"f{i}"}), b"x")
    a.faults.lose_send_acks(1)  # the first send to broker-a is stored, its reply never comes
    sender = RocketMQSender.connect(c.namesrv_addrs[0], "rmq_route_p")
    try:
        r = sender.send(OutgoingMessage("m0", TOPIC, b"x"))
    finally:
        sender.close()
    holder = c.brokers[r.broker_name].broker
    assert holder is not None
    stored = {m.queue_offset: m.keys for m in holder.messages(TOPIC, r.queue_id)}
    assert stored.get(r.queue_offset) == "m0", (r, stored)
