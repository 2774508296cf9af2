"""Where a new consumer group starts: QUERY_CONSUMER_OFFSET as ``ConsumerManageProcessor.queryConsumerOffset``
answers it in 4.9.8, and deprecated ``ConsumeFromWhere`` values as ``RebalancePushImpl`` treats them."""

from __future__ import annotations

import json
from pathlib import Path

from broker_sim import Broker, ConsumeFromWhere, ConsumeStatus, Message, MessageExt, Producer, PushConsumer
from broker_sim.common.requests import (
    ConsumerData,
    ConsumeType,
    HeartbeatData,
    MessageModel,
    SubscriptionData,
)
from broker_sim.remoting.bodies import parse_heartbeat
from tests.waiting import wait_until

from .conftest import SMALL_STORE


def _fill(broker: Broker, n: int, size: int) -> None:
    p = Producer(broker, "P")
    for i in range(n):
        p.send(Message("T", bytes(size), keys=f"k{i}"), queue=p.fetch_publish_message_queues("T")[0])
    p.shutdown()


def test_new_group_gets_zero_while_offset_zero_is_in_memory(broker: Broker) -> None:
    """minOffset 0 and the first message still in memory → SUCCESS with offset 0."""
    _fill(broker, 3, 100)
    assert broker.query_consumer_offset("new-group", "T", 0) == 0


def test_new_group_gets_22_when_offset_zero_left_memory(tmp_path: Path) -> None:
    """checkInDiskByConsumeOffset(topic, queue, 0) true (the first message lies further behind the log's
    end than accessMessageInMemoryMaxRatio % of physical memory) → QUERY_NOT_FOUND (22), although the queue
    still starts at 0; the client then applies CONSUME_FROM_LAST_OFFSET."""
    b = Broker(
        tmp_path / "store", topics={"T": 1}, total_physical_memory_bytes=10_000,
        access_message_in_memory_max_ratio=40, **SMALL_STORE,
    ).start()  # fmt: skip
    try:
        _fill(b, 3, 100)
        assert b.get_min_offset("T", 0) == 0
        assert b.query_consumer_offset("new-group", "T", 0) == 0  # 3 small records: within 4000 bytes
        _fill(b, 40, 200)  # now > 4000 bytes behind the end
        assert b.query_consumer_offset("new-group", "T", 0) is None
        b.commit_consumer_offset("old-group", "T", 0, 5)
        assert b.query_consumer_offset("old-group", "T", 0) == 5  # a committed offset always wins
    finally:
        b.shutdown()


def test_deprecated_consume_from_where_in_a_heartbeat_registers_the_consumer(broker: Broker) -> None:
    """ConsumeFromWhere (4.9.8) still lists CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST (1),
    CONSUME_FROM_MIN_OFFSET (2) and CONSUME_FROM_MAX_OFFSET (3); a heartbeat carrying them (as an integer
    from C++, as a name from Java's fastjson) registers the consumer."""
    for value, expected in (
        (2, ConsumeFromWhere.CONSUME_FROM_MIN_OFFSET),
        ("CONSUME_FROM_MAX_OFFSET", ConsumeFromWhere.CONSUME_FROM_MAX_OFFSET),
        (1, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST),
    ):
        consumer = {
            "groupName": "G", "consumeType": 1, "messageModel": 1, "consumeFromWhere": value,
            "subscriptionDataSet": [{"topic": "T", "subString": "*"}],
        }  # fmt: skip
        data = parse_heartbeat(json.dumps({"clientID": "c-1", "consumerDataSet": [consumer]}).encode())
        assert data.consumers[0].consume_from_where is expected
    data = HeartbeatData(
        "c-1",
        consumers=(
            ConsumerData("G", ConsumeType.CONSUME_PASSIVELY, MessageModel.CLUSTERING,
                         ConsumeFromWhere.CONSUME_FROM_MIN_OFFSET, (SubscriptionData("T"),)),
        ),
    )  # fmt: skip
    broker.client_transport().heartbeat(data, _NoChannel())
    assert broker.get_consumer_list_by_group("G") == ["c-1"]


def test_deprecated_consume_from_where_starts_like_last_offset(tmp_path: Path) -> None:
    """RebalancePushImpl.computePullFromWhere: MIN/MAX/LAST_AND_FROM_MIN fall through to LAST_OFFSET — a
    new group whose queue left memory starts at the max offset, whatever the deprecated name suggests."""
    b = Broker(tmp_path / "store", topics={"T": 1}, total_physical_memory_bytes=100, **SMALL_STORE).start()
    try:
        _fill(b, 5, 100)
        seen: list[bytes] = []

        def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            seen.extend(m.body for m in msgs)
            return ConsumeStatus.CONSUME_SUCCESS

        c = PushConsumer(b, "G", consume_from_where=ConsumeFromWhere.CONSUME_FROM_MIN_OFFSET)
        c.subscribe("T", "*", listener).start()
        wait_until(lambda: bool(c.process_queues), what="the queue assigned")
        Producer(b, "P").send(Message("T", b"new"))
        wait_until(lambda: seen == [b"new"], what="only the message sent after start")
        c.shutdown()
    finally:
        b.shutdown()


class _NoChannel:
    remote_address = "test"

    def check_transaction_state(self, *args: object) -> None:
        raise AssertionError("no transactions here")

    def notify_consumer_ids_changed(self, consumer_group: str) -> None:
        pass
