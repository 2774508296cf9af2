"""The operator requests that reach a consumer (``Broker2Client`` in 4.9.8: RESET_CONSUMER_CLIENT_OFFSET,
GET_CONSUMER_RUNNING_INFO, CONSUME_MESSAGE_DIRECTLY) with the consumer in the broker's own process."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from broker_sim import Broker, ConsumeFromWhere, ConsumeStatus, Message, MessageExt, Producer, PushConsumer
from broker_sim.common.errors import BrokerResponseError
from broker_sim.common.requests import ResponseCode
from tests.waiting import wait_until


def test_reset_running_info_and_consume_directly_in_process(broker: Broker) -> None:
    lock = threading.Lock()
    seen: Counter[bytes] = Counter()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            seen.update(m.body for m in msgs)
        return ConsumeStatus.RECONSUME_LATER if msgs[0].body == b"later" else ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(broker, "G", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    c.subscribe("T", "*", listener).start()
    p = Producer(broker, "P")
    try:
        for i in range(8):
            p.send(Message("T", f"m{i}".encode()))
        wait_until(lambda: sum(seen.values()) == 8, what="the first pass")
        wait_until(lambda: sum(q.lag for q in broker.consumer_progress("G", "T")) == 0, what="committed")
        table = broker.reset_offset_by_time("T", "G", 0)
        assert sorted(table.values()) == [0, 0, 0, 0]
        wait_until(lambda: sum(seen.values()) == 16, what="the second pass after the reset")
        info = broker.consumer_running_info("G", c.client_id)
        assert info["properties"]["clientId"] == c.client_id
        assert {(r["topic"], r["queueId"]) for r in info["mqTable"]} == {("T", q) for q in range(4)} | {
            ("%RETRY%G", 0)
        }
        later = p.send(Message("T", b"later"))
        wait_until(lambda: seen[b"later"] >= 1, what="the RECONSUME_LATER message")
        result = broker.consume_message_directly("G", c.client_id, later.offset_msg_id)
        assert result["consumeResult"] == "CR_LATER" and result["order"] is False
        assert broker.topic_consumed_by("T") == ["G"]
    finally:
        p.shutdown()
        c.shutdown()


def test_reset_of_an_offline_group_is_consumer_not_online(broker: Broker) -> None:
    """Broker2Client.resetOffset: a group with offsets but no live client → CONSUMER_NOT_ONLINE (206);
    a group without offsets → SYSTEM_ERROR "The consumer group <G> not exist"."""
    with pytest.raises(BrokerResponseError, match="not exist") as missing:
        broker.reset_offset_by_time("T", "Nobody", 0)
    assert missing.value.code == ResponseCode.SYSTEM_ERROR
    for q in range(4):
        broker.commit_consumer_offset("Offline", "T", q, 0)
    with pytest.raises(BrokerResponseError) as offline:
        broker.reset_offset_by_time("T", "Offline", 0)
    assert offline.value.code == ResponseCode.CONSUMER_NOT_ONLINE
