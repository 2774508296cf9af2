"""Wire-level conformance: requests shaped like the C++ client's (captured field types), replies checked
against the rules G1–G14 of the reference, byte for byte where it matters."""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Iterator

import pytest

from broker_sim.remoting.client import RemotingConnection
from broker_sim.remoting.codes import RequestCode, ResponseCode
from broker_sim.remoting.frame import RemotingCommand
from broker_sim.remoting.serve import BrokerSimServer
from tests.broker_sim.remoting.conftest import ServerFactory
from tests.waiting import wait_until

# Field types as the 0.4.4 client sends them (numbers where it sends JSON numbers)
CPP_ACL = {"AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "x"}


def cpp_send(topic: str, queue_id: int, body: bytes, key: str) -> RemotingCommand:
    fields = {
        **CPP_ACL,
        "batch": "0",
        "bornTimestamp": "1795223524730",
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "flag": 0,
        "producerGroup": "RealPG",
        "properties": f"KEYS\x01{key}\x02UNIQ_KEY\x01U{key}\x02WAIT\x01true\x02",
        "queueId": queue_id,
        "reconsumeTimes": "0",
        "sysFlag": 0,
        "topic": topic,
        "unitMode": "0",
    }
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, fields, body)


def cpp_pull(
    topic: str, queue_id: int, offset: int, sys_flag: int = 6, suspend_ms: int = 15000
) -> RemotingCommand:
    fields = {
        **CPP_ACL,
        "commitOffset": "0",
        "consumerGroup": "RealCG",
        "maxMsgNums": 32,
        "queueId": queue_id,
        "queueOffset": str(offset),
        "subVersion": "1",
        "subscription": "*",
        "suspendTimeoutMillis": str(suspend_ms),
        "sysFlag": sys_flag,
        "topic": topic,
    }
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, fields)


@pytest.fixture
def srv(serve: ServerFactory) -> BrokerSimServer:
    return serve(topics={"T": 2})


@pytest.fixture
def broker(srv: BrokerSimServer) -> Iterator[RemotingConnection]:
    conn = RemotingConnection(srv.broker_address)
    yield conn
    conn.close()


def test_send_reply_fields_are_strings(broker: RemotingConnection) -> None:
    rep = broker.invoke(cpp_send("T", 1, b"hello", "k1"), 5)
    assert rep.code == ResponseCode.SUCCESS
    assert set(rep.ext_fields) >= {"msgId", "queueId", "queueOffset"}  # G3
    assert all(isinstance(v, str) for v in rep.ext_fields.values())  # G2
    assert rep.ext_fields["queueId"] == "1" and rep.ext_fields["queueOffset"] == "0"
    assert len(rep.ext_fields["msgId"]) == 32


def test_pull_body_is_records_with_the_reachable_store_host(
    srv: BrokerSimServer, broker: RemotingConnection
) -> None:
    for i in range(3):
        broker.invoke(cpp_send("T", 0, f"m{i}".encode(), f"k{i}"), 5)
    replies: list[RemotingCommand] = []

    def pulled_all_three() -> bool:
        replies.append(broker.invoke(cpp_pull("T", 0, 0, sys_flag=4), 5))
        return replies[-1].ext_fields.get("nextBeginOffset") == "3"

    # consume queues are dispatched asynchronously from the commit log: poll until all three are visible
    assert wait_until(pulled_all_three)
    rep = replies[-1]
    assert rep.code == ResponseCode.SUCCESS and rep.body  # G10
    assert set(rep.ext_fields) >= {"nextBeginOffset", "minOffset", "maxOffset", "suggestWhichBrokerId"}
    host, port = srv.broker_address.split(":")
    pos, records = 0, []
    while pos < len(rep.body):  # walk the records by TOTALSIZE, read fields at their §E offsets
        size, magic = struct.unpack_from(">iI", rep.body, pos)
        assert magic == 0xDAA320A7
        queue_offset, phys = struct.unpack_from(">qq", rep.body, pos + 20)
        sys_flag = struct.unpack_from(">i", rep.body, pos + 36)[0]
        store_ip, store_port = rep.body[pos + 64 : pos + 68], struct.unpack_from(">i", rep.body, pos + 68)[0]
        assert sys_flag & 0x30 == 0  # G6: IPv4 host fields
        assert (".".join(map(str, store_ip)), store_port) == (host, int(port))  # G7
        records.append((queue_offset, phys))
        pos += size
    assert [q for q, _ in records] == [0, 1, 2]  # G8: the real queue offsets
    # G8: PHYSICALOFFSET finds the message again (VIEW_MESSAGE_BY_ID by commit-log offset)
    view = broker.invoke(
        RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(records[1][1])}), 5
    )
    assert view.code == ResponseCode.SUCCESS and b"m1" in view.body


def test_pull_outcomes(broker: RemotingConnection) -> None:
    def pull(offset: int, queue: int = 1) -> tuple[int, str]:
        rep = broker.invoke(cpp_pull("T", queue, offset, sys_flag=4), 5)
        assert not rep.body or rep.code == ResponseCode.SUCCESS
        return rep.code, rep.ext_fields.get("nextBeginOffset", "")

    assert pull(0) == (ResponseCode.PULL_NOT_FOUND, "0")  # empty queue at 0
    assert pull(5)[0] == ResponseCode.PULL_OFFSET_MOVED  # empty queue, offset != 0
    broker.invoke(cpp_send("T", 1, b"x", "k"), 5)
    assert wait_until(lambda: pull(0) == (ResponseCode.SUCCESS, "1"))
    assert pull(1) == (ResponseCode.PULL_NOT_FOUND, "1")  # at max, no SUSPEND bit: answered at once
    # beyond max: moved, next = max (DefaultMessageStore.getMessage in 4.9.8, OFFSET_OVERFLOW_BADLY on a
    # master; 4.9.0-4.9.3 pointed back to 0 while the min offset was 0)
    assert pull(9) == (ResponseCode.PULL_OFFSET_MOVED, "1")


def test_suspended_pull_is_held_until_a_message_arrives(broker: RemotingConnection) -> None:
    """G9: SUSPEND at the end of a queue parks the pull; a send wakes it with the new message."""
    box: list[RemotingCommand | BaseException] = []
    done = threading.Event()

    def on_reply(reply: RemotingCommand | BaseException) -> None:
        box.append(reply)
        done.set()

    broker.invoke_async(cpp_pull("T", 0, 0, sys_flag=6, suspend_ms=15000), on_reply, 30)
    assert not done.wait(0.3)  # held (nothing to return yet)
    broker.invoke(cpp_send("T", 0, b"wake", "kw"), 5)
    assert done.wait(10)
    rep = box[0]
    assert isinstance(rep, RemotingCommand) and rep.code == ResponseCode.SUCCESS and b"wake" in rep.body


def test_offsets_for_a_new_group_and_updates(broker: RemotingConnection) -> None:
    q = {**CPP_ACL, "consumerGroup": "NewG", "topic": "T", "queueId": 0}
    rep = broker.invoke(RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, q), 5)
    assert (rep.code, rep.ext_fields) == (ResponseCode.SUCCESS, {"offset": "0"})  # G13
    upd = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": "5"}, oneway=True)
    broker.invoke_oneway(upd)
    assert wait_until(
        lambda: (
            broker.invoke(RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, q), 5).ext_fields
            == {"offset": "5"}
        )
    )
    for code in (RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET):
        rep = broker.invoke(RemotingCommand.request(code, {"topic": "T", "queueId": 0}), 5)
        assert rep.code == ResponseCode.SUCCESS and rep.ext_fields == {"offset": "0"}  # G3


def test_heartbeat_then_consumer_list_returns_the_client_id(broker: RemotingConnection) -> None:
    """G12: the consumer list holds exactly the clientID sent in HEART_BEAT."""
    body = {
        "clientID": "777-127.0.0.1@DEFAULT",
        "consumerDataSet": [
            {
                "groupName": "HG",
                "consumeType": 1,
                "messageModel": 1,
                "consumeFromWhere": 0,
                "subscriptionDataSet": [{"topic": "T", "subString": "*", "subVersion": 1}],
            }
        ],
    }
    rep = broker.invoke(
        RemotingCommand.request(RequestCode.HEART_BEAT, CPP_ACL, json.dumps(body).encode()), 5
    )
    assert rep.code == ResponseCode.SUCCESS
    rep = broker.invoke(
        RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "HG"}), 5
    )
    assert json.loads(rep.body) == {"consumerIdList": ["777-127.0.0.1@DEFAULT"]}


def test_error_codes(broker: RemotingConnection) -> None:
    assert broker.invoke(cpp_send("Nope", 0, b"x", "k"), 5).code == ResponseCode.TOPIC_NOT_EXIST
    assert broker.invoke(cpp_send("T", 0, b"x", "k"), 5).code == ResponseCode.SUCCESS
    rep = broker.invoke(RemotingCommand.request(999), 5)
    assert (rep.code, rep.remark) == (
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
        "request type 999 not supported",
    )
    rep = broker.invoke(RemotingCommand.request(RequestCode.PULL_MESSAGE, {"topic": "T"}), 5)
    assert rep.code == ResponseCode.SYSTEM_ERROR and "consumerGroup" in (rep.remark or "")
    rep = broker.invoke(RemotingCommand.request(RequestCode.HEART_BEAT, body=b"{not json"), 5)
    assert rep.code == ResponseCode.SYSTEM_ERROR
