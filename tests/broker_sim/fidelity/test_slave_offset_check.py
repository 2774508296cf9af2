"""Who may move a reader's offset, as RocketMQ 4.9.8 decides it.

``DefaultMessageStore.nextOffsetCorrection`` gives a reader whose offset is out of range a new one only on a
master (or with ``offsetCheckInSlave``); a slave keeps the offset asked for. ``PullMessageProcessor`` then
answers a slave's PULL_OFFSET_MOVED as PULL_RETRY_IMMEDIATELY naming the group's ``brokerId`` (the master).
Why it matters: a slave can lack part of a queue its master has — its dispatch lags, its tail was not
replicated, or it only ever copied the master's last segment. A consumer moved by such a slave would skip (or
read again) what the master holds, once it reads from the master again.

The slave here is the master's store reopened as a SLAVE (same files), so both answer over the same data.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_sim import Broker, Message, Producer
from broker_sim.common.message import MessageQueue
from broker_sim.common.requests import PullMessageRequest, ResponseCode

from .conftest import SMALL_STORE

#: queue 0 holds three messages, queue 1 none
TOPICS = {"T": 2}


def _stored(path: Path) -> None:
    master = Broker(path, topics=TOPICS, **SMALL_STORE).start()
    producer = Producer(master, "P")
    try:
        for i in range(3):
            producer.send(
                Message("T", f"m{i}".encode()), queue=MessageQueue("T", master.config.broker_name, 0)
            )
    finally:
        producer.shutdown()
        master.shutdown()


def _reopened(path: Path, role: str, check_in_slave: bool = False) -> Broker:
    slave = {"broker_role": "SLAVE", "broker_id": 1} if role == "slave" else {}
    return Broker(path, topics=TOPICS, offset_check_in_slave=check_in_slave, **slave, **SMALL_STORE).start()


def _pull(broker: Broker, queue_id: int, offset: int) -> tuple[int, int, int]:
    req = PullMessageRequest("G", "T", queue_id, offset, max_msg_nums=1, suspend_timeout_ms=0)
    resp = broker.pull_message(req)
    return resp.code, resp.next_begin_offset, resp.suggest_which_broker_id


@pytest.mark.parametrize(
    ("role", "check_in_slave", "queue_id", "offset", "expected"),
    [
        # past the end: a master moves the reader to its max offset …
        ("master", False, 0, 9, (ResponseCode.PULL_OFFSET_MOVED, 3, 0)),
        # … a slave leaves it where it is and sends it to the master
        ("slave", False, 0, 9, (ResponseCode.PULL_RETRY_IMMEDIATELY, 9, 0)),
        # offsetCheckInSlave: the slave moves it as a master would
        ("slave", True, 0, 9, (ResponseCode.PULL_OFFSET_MOVED, 3, 0)),
        # an empty queue: a master moves the reader to 0, a slave does not
        ("master", False, 1, 5, (ResponseCode.PULL_OFFSET_MOVED, 0, 0)),
        ("slave", False, 1, 5, (ResponseCode.PULL_RETRY_IMMEDIATELY, 5, 0)),
        # in range, both serve the message
        ("slave", False, 0, 1, (ResponseCode.SUCCESS, 2, 0)),
    ],
)
def test_only_a_master_moves_an_out_of_range_offset(
    tmp_path: Path,
    role: str,
    check_in_slave: bool,
    queue_id: int,
    offset: int,
    expected: tuple[int, int, int],
) -> None:
    _stored(tmp_path)
    broker = _reopened(tmp_path, role, check_in_slave)
    try:
        assert _pull(broker, queue_id, offset) == expected
    finally:
        broker.shutdown()
