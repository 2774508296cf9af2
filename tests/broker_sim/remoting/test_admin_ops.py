"""The operator requests of ``mqadmin`` / the dashboard and the matching ``broker-sim admin`` commands, end to
end over TCP against a served broker (AdminBrokerProcessor, Broker2Client, DefaultRequestProcessor and
ClientRemotingProcessor of RocketMQ 4.9.8 are the model)."""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest

from broker_sim import ConsumeFromWhere, ConsumeStatus, Message, MessageExt, Producer, PushConsumer
from broker_sim.cli import main
from broker_sim.remoting.admin_client import AdminClient
from broker_sim.remoting.codes import RequestCode, ResponseCode
from broker_sim.remoting.serve import BrokerSimServer
from tests.broker_sim.remoting.conftest import ServerFactory, running_broker
from tests.waiting import wait_until


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _send(namesrv: str, n: int, topic: str = "T") -> None:
    p = Producer(namesrv, "PG")
    for i in range(n):
        p.send(Message(topic, f"m{i}".encode(), keys=f"k{i}"))
    p.shutdown()


class Seen:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bodies: Counter[bytes] = Counter()

    def __call__(self, msgs: list[MessageExt]) -> ConsumeStatus:
        with self.lock:
            self.bodies.update(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS


@pytest.fixture
def srv(serve: ServerFactory) -> BrokerSimServer:
    return serve(topics={"T": 2})


def test_cluster_list_and_topic_status(srv: BrokerSimServer, capsys: pytest.CaptureFixture[str]) -> None:
    """GET_BROKER_CLUSTER_INFO + GET_BROKER_RUNTIME_INFO (28) → cluster list; GET_TOPIC_STATS_INFO (202)."""
    ns = ["admin", "--namesrv", srv.namesrv_address, "--json"]
    code, out, _ = cli([*ns, "cluster", "list"], capsys)
    (row,) = json.loads(out)
    assert code == 0 and row["addr"] == srv.broker_address and row["version"] == "V4_9_8"
    _send(srv.namesrv_address, 5)
    assert wait_until(
        lambda: sum(r["maxOffset"] for r in json.loads(cli([*ns, "topic", "status", "T"], capsys)[1])) == 5
    )
    rows = json.loads(cli([*ns, "topic", "status", "T"], capsys)[1])
    assert [r["queue"] for r in rows] == [0, 1] and all(r["minOffset"] == 0 for r in rows)
    assert all(r["lastUpdated"] for r in rows if r["maxOffset"])


def test_group_update_changes_the_retry_limit(
    srv: BrokerSimServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200) and GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201)."""
    ns = ["admin", "--namesrv", srv.namesrv_address, "--json"]
    code, out, _ = cli(
        [*ns, "group", "update", "G", "--retry-max-times", "3", "--no-broadcast-enable"], capsys
    )
    assert code == 0 and json.loads(out)["retryMaxTimes"] == 3
    assert srv.broker is not None and srv.broker.groups.find("G").retry_max_times == 3
    assert srv.broker.groups.find("G").consume_broadcast_enable is False
    listed = {r["groupName"]: r for r in json.loads(cli([*ns, "group", "list"], capsys)[1])}
    assert listed["G"]["retryMaxTimes"] == 3


def test_live_consumer_connection_running_info_and_consume_directly(
    srv: BrokerSimServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """GET_CONSUMER_CONNECTION_LIST (203); GET_CONSUMER_RUNNING_INFO (307) and CONSUME_MESSAGE_DIRECTLY
    (309) forwarded by the broker to the client over its connection and answered by it."""
    seen = Seen()
    c = PushConsumer(srv.namesrv_address, "G", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    c.subscribe("T", "*", seen).start()
    try:
        _send(srv.namesrv_address, 4)
        assert wait_until(lambda: len(seen.bodies) == 4)
        ns = ["admin", "--namesrv", srv.namesrv_address, "--json"]
        conn = json.loads(cli([*ns, "consumer", "connection", "G"], capsys)[1])
        assert [x["clientId"] for x in conn["connectionSet"]] == [c.client_id]
        assert "T" in conn["subscriptionTable"] and conn["messageModel"] == "CLUSTERING"
        info = json.loads(cli([*ns, "consumer", "running-info", "G", c.client_id], capsys)[1])
        assert info["properties"]["consumerGroup"] == "G"
        assert {(r["topic"], r["queueId"]) for r in info["mqTable"]} >= {("T", 0), ("T", 1)}
        assert srv.broker is not None
        msg = srv.broker.messages("T", 0)[0]
        result = json.loads(
            cli([*ns, "consumer", "consume-directly", "G", c.client_id, "--id", msg.offset_msg_id], capsys)[1]
        )
        assert result["consumeResult"] == "CR_SUCCESS"
        assert seen.bodies[msg.body] == 2  # the listener ran once more on it, nothing else changed
    finally:
        c.shutdown()


def test_reset_offset_by_time_restarts_a_live_consumer(
    srv: BrokerSimServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """INVOKE_BROKER_TO_RESET_OFFSET (222): the broker computes offsets by time and pushes
    RESET_CONSUMER_CLIENT_OFFSET (220) to the live client, which consumes again from there."""
    seen = Seen()
    c = PushConsumer(srv.namesrv_address, "G", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    c.subscribe("T", "*", seen).start()
    try:
        _send(srv.namesrv_address, 6)
        assert wait_until(lambda: sum(seen.bodies.values()) == 6)
        broker = running_broker(srv)
        assert wait_until(lambda: sum(p.lag for p in broker.consumer_progress("G", "T")) == 0)
        ns = ["admin", "--namesrv", srv.namesrv_address, "--json"]
        code, out, err = cli([*ns, "consumer", "reset-offset", "G", "--topic", "T", "--time", "0"], capsys)
        assert code == 0, err
        assert sorted(r["offset"] for r in json.loads(out)) == [0, 0]
        assert wait_until(lambda: sum(seen.bodies.values()) == 12)
        assert set(seen.bodies.values()) == {2}
    finally:
        c.shutdown()


def test_reset_offset_of_an_offline_group(srv: BrokerSimServer, capsys: pytest.CaptureFixture[str]) -> None:
    """Broker2Client.resetOffset answers CONSUMER_NOT_ONLINE (206) for a group without live clients; the
    command then commits the offsets itself, as mqadmin's fallback does."""
    broker = running_broker(srv)
    _send(srv.namesrv_address, 4)
    assert wait_until(lambda: sum(broker.get_max_offset("T", q) for q in (0, 1)) == 4)
    for q in (0, 1):
        broker.update_consumer_offset("G", "T", q, 0)
    ns = ["admin", "--namesrv", srv.namesrv_address]
    code, out, err = cli([*ns, "consumer", "reset-offset", "G", "--topic", "T", "--time", "latest"], capsys)
    assert code == 0, err
    assert "offline" in out
    assert wait_until(lambda: sum(p.lag for p in broker.consumer_progress("G", "T")) == 0)


def test_delete_topic_removes_config_offsets_and_route(
    srv: BrokerSimServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """DELETE_TOPIC_IN_BROKER (215) then DELETE_TOPIC_IN_NAMESRV (216), as mqadmin deleteTopic."""
    assert srv.broker is not None
    srv.broker.update_consumer_offset("G", "T", 0, 1)
    ns = ["admin", "--namesrv", srv.namesrv_address]
    assert cli([*ns, "topic", "delete", "T"], capsys)[0] == 0
    assert srv.broker.topics.select("T") is None and srv.broker.offsets.table("G", "T") == {}
    code, _, err = cli([*ns, "topic", "route", "T"], capsys)
    assert code == 1 and err.count("\n") == 1 and "No topic route info" in err


def test_name_server_kv_config_and_topics_by_cluster(srv: BrokerSimServer) -> None:
    """DefaultRequestProcessor: GET_KV_CONFIG (101) → QUERY_NOT_FOUND until PUT_KV_CONFIG (100);
    GET_TOPICS_BY_CLUSTER (224)."""
    admin = AdminClient(srv.namesrv_address)
    t = admin.transport
    try:
        ask = {"namespace": "ORDER_TOPIC_CONFIG", "key": "T"}
        reply = t._invoke(t.address, t._req(RequestCode.GET_KV_CONFIG, ask))
        assert reply.code == ResponseCode.QUERY_NOT_FOUND
        t._ok(t._invoke(t.address, t._req(RequestCode.PUT_KV_CONFIG, {**ask, "value": "broker-a:2"})))
        reply = t._ok(t._invoke(t.address, t._req(RequestCode.GET_KV_CONFIG, ask)))
        assert reply.ext_fields["value"] == "broker-a:2"
        reply = t._ok(
            t._invoke(t.address, t._req(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "DefaultCluster"}))
        )
        assert "T" in json.loads(reply.body)["topicList"]
    finally:
        admin.close()


def test_topic_consumed_by_and_query_consume_queue(srv: BrokerSimServer) -> None:
    """QUERY_TOPIC_CONSUME_BY_WHO (300) and QUERY_CONSUME_QUEUE (321)."""
    broker = running_broker(srv)
    _send(srv.namesrv_address, 3)
    broker.update_consumer_offset("G1", "T", 0, 0)
    admin = AdminClient(srv.namesrv_address)
    try:
        reply = admin._broker_call(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "T"})
        assert json.loads(reply.body)["groupList"] == ["G1"]
        assert wait_until(lambda: broker.get_max_offset("T", 0) >= 1)
        fields = {"topic": "T", "queueId": 0, "index": 0, "count": 10, "consumerGroup": "G1"}
        body = json.loads(admin._broker_call(RequestCode.QUERY_CONSUME_QUEUE, fields).body)
        units = body["queueData"]
        assert [u["queueOffset"] for u in units] == list(range(body["maxQueueIndex"]))
        first = broker.messages("T", 0)[0]
        assert units[0]["physicOffset"] == first.commit_log_offset
    finally:
        admin.close()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["topic", "status", "Missing"], "not exist"),
        (["consumer", "connection", "Nobody"], "not online"),
        (["consumer", "reset-offset", "G", "--topic", "T", "--time", "yesterday"], "--time expects"),
        (["consumer", "reset-offset", "Nobody", "--topic", "T", "--time", "now"], "not exist"),
        (["group", "update", "G", "--retry-max-times", "-1"], "--retry-max-times"),
        (["consumer", "running-info", "G", "no-such-client"], "not online"),
    ],
)
def test_new_admin_errors_are_one_line(
    srv: BrokerSimServer, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = cli(["admin", "--namesrv", srv.namesrv_address, *argv], capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("broker-sim: error:") and message in err
