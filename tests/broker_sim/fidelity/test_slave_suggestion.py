"""``suggestWhichBrokerId`` in pull replies, as RocketMQ 4.9.8 computes it.

``DefaultMessageStore.getMessage`` marks a read as slow (``suggestPullingFromSlave``) when the commit log's
max physical offset lies more than ``TOTAL_PHYSICAL_MEMORY_SIZE × accessMessageInMemoryMaxRatio %`` beyond
the last message the read looked at; ``PullMessageProcessor.processRequest`` then names
``SubscriptionGroupConfig.whichBrokerWhenConsumeSlowly`` (1) for a slow read and the group's ``brokerId`` (0)
otherwise — but only with ``BrokerConfig.slaveReadEnable``; without it every reply names the master
(``MixAll.MASTER_ID``). broker_sim takes the machine's memory as a broker option
(``total_physical_memory_bytes``) so a test can make the share small.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_sim import Broker, Message, Producer
from broker_sim.broker.clients import SubscriptionGroupConfig
from broker_sim.common.requests import PullMessageRequest, ResponseCode

from .conftest import SMALL_STORE

BODY = b"x" * 1000
#: 40 % of 10 000 bytes: the last ~4 records of the commit log count as "in memory"
MEMORY = 10_000


def _broker(path: Path, slave_read: bool) -> Broker:
    return Broker(
        path, topics={"T": 1}, slave_read_enable=slave_read, total_physical_memory_bytes=MEMORY, **SMALL_STORE
    ).start()


def _suggestion(broker: Broker, offset: int, group: str = "G") -> int:
    req = PullMessageRequest(group, "T", 0, offset, max_msg_nums=1, suspend_timeout_ms=0)
    resp = broker.pull_message(req)
    assert resp.code == ResponseCode.SUCCESS
    return resp.suggest_which_broker_id


@pytest.mark.parametrize("slave_read", [True, False])
def test_a_reader_behind_the_memory_share_is_sent_to_the_slave(tmp_path: Path, slave_read: bool) -> None:
    broker = _broker(tmp_path / "s", slave_read)
    producer = Producer(broker, "P")
    try:
        for _ in range(20):
            producer.send(Message("T", BODY))
        # message 0 lies ~19 records (> 4 000 bytes) behind the end; message 19 is the last one
        assert _suggestion(broker, 0) == (1 if slave_read else 0)
        assert _suggestion(broker, 19) == 0
        if slave_read:
            # the group's own choice of slave (whichBrokerWhenConsumeSlowly) and of normal node (brokerId)
            choice = SubscriptionGroupConfig("G2", broker_id=1, which_broker_when_consume_slowly=2)
            broker.groups.update(choice)
            assert (_suggestion(broker, 0, "G2"), _suggestion(broker, 19, "G2")) == (2, 1)
    finally:
        producer.shutdown()
        broker.shutdown()


def test_the_subscription_group_json_carries_the_node_choices(tmp_path: Path) -> None:
    sg = SubscriptionGroupConfig("G", broker_id=1, which_broker_when_consume_slowly=3)
    d = sg.to_json()
    assert (d["brokerId"], d["whichBrokerWhenConsumeSlowly"]) == (1, 3)
    assert SubscriptionGroupConfig.from_json(d) == sg
    assert SubscriptionGroupConfig.from_json({"groupName": "H"}).which_broker_when_consume_slowly == 1
