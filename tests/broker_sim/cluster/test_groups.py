"""Two broker groups registering with name servers over TCP, and broker_sim's own clients spreading over them
(RocketMQ 4.9.8: ``BrokerController.registerBrokerAll``, ``RouteInfoManager``, ``MQClientInstance``)."""

from __future__ import annotations

import json
import threading
from functools import partial

from broker_sim import Broker, ConsumeStatus, Message, Producer, PushConsumer
from broker_sim.common.message import MessageExt
from broker_sim.common.requests import ConsumeFromWhere
from broker_sim.remoting.admin_client import AdminClient
from broker_sim.remoting.client_transport import RemotingTransport
from broker_sim.remoting.codes import RequestCode
from tests.broker_sim.remoting.conftest import running_broker
from tests.clusters import ClusterFactory
from tests.waiting import wait_until


def ask(namesrv: str, code: int, fields: dict[str, object] | None = None) -> object:
    t = RemotingTransport(namesrv)
    try:
        reply = t._ok(t._ask_namesrv(code, fields))
        return json.loads(reply.body)
    finally:
        t.close()


def test_every_name_server_holds_the_same_routes_and_sees_new_topics_at_once(cluster: ClusterFactory) -> None:
    """Brokers register with *every* name server (BrokerOuterAPI.registerBrokerAll), and again as soon as
    a topic is created (TopicConfigManager → registerBrokerAll), so two independent name servers agree."""
    c = cluster(namesrvs=2, topics={"T": 4})
    ns1, ns2 = c.namesrv_addrs
    route = ask(ns1, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert route == ask(ns2, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert isinstance(route, dict)
    assert {b["brokerName"]: b["brokerAddrs"] for b in route["brokerDatas"]} == {
        name: {"0": srv.broker_address} for name, srv in c.brokers.items()
    }
    info = ask(ns1, RequestCode.GET_BROKER_CLUSTER_INFO)
    assert info == ask(ns2, RequestCode.GET_BROKER_CLUSTER_INFO)
    assert isinstance(info, dict) and info["clusterAddrTable"] == {"DefaultCluster": ["broker-a", "broker-b"]}
    broker_b = c.brokers["broker-b"].broker
    assert broker_b is not None
    broker_b.create_topic("OnlyB", 2)
    for ns in (ns1, ns2):
        only_b = ask(ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "OnlyB"})
        assert isinstance(only_b, dict) and [q["brokerName"] for q in only_b["queueDatas"]] == ["broker-b"]
        topics = ask(ns, RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "DefaultCluster"})
        assert isinstance(topics, dict) and {"T", "OnlyB"} <= set(topics["topicList"])


def test_a_broker_that_stops_leaves_every_name_server(cluster: ClusterFactory) -> None:
    """UNREGISTER_BROKER (104) at a clean shutdown: routes stop naming the group at once."""
    c = cluster(namesrvs=2, topics={"T": 4})
    c.brokers["broker-a"].shutdown()
    for ns in c.namesrv_addrs:
        route = ask(ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
        assert isinstance(route, dict) and [b["brokerName"] for b in route["brokerDatas"]] == ["broker-b"]


def test_clients_spread_over_both_groups_and_rotate_past_a_dead_name_server(cluster: ClusterFactory) -> None:
    """A producer writes to every group's queues (the route has 2 × 4 write queues); a push consumer's
    rebalance takes all 8 queues and commits each queue's offset to its own group's broker. The client is
    given two name servers and the first one is down: it moves to the next, as the Java client does."""
    c = cluster(namesrvs=2, topics={"T": 4})
    dead = c.namesrvs[0]
    dead.shutdown()
    ns = ";".join(c.namesrv_addrs)
    producer = Producer(ns, "PG")
    seen: dict[bytes, MessageExt] = {}
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            for m in msgs:
                seen[m.body] = m
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(ns, "CG", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe("T", "*", listener)
    try:
        results = [producer.send(Message("T", f"m{i}".encode())) for i in range(40)]
        assert {(r.broker_name, r.queue_id) for r in results} == {
            (b, q) for b in ("broker-a", "broker-b") for q in range(4)
        }
        consumer.start()
        assert wait_until(lambda: len(seen) == 40)
        assert {m.broker_name for m in seen.values()} == {"broker-a", "broker-b"}
        consumer.persist_offsets()

        def committed(broker: Broker, want: int) -> bool:
            return sum(p.consumer_offset for p in broker.consumer_progress("CG", "T")) == want

        for name, srv in c.brokers.items():
            want = sum(1 for r in results if r.broker_name == name)
            assert wait_until(partial(committed, running_broker(srv), want))
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_admin_cluster_list_shows_every_group(cluster: ClusterFactory) -> None:
    c = cluster(namesrvs=1)
    admin = AdminClient(c.namesrv_addrs[0])
    try:
        table = admin.cluster_info()["brokerAddrTable"]
        assert sorted(table) == ["broker-a", "broker-b"]
    finally:
        admin.close()
