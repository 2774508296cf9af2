"""A consumer reading an old backlog is sent to the slave and back (RocketMQ 4.9.8: the master's
``PullMessageProcessor`` answers ``suggestWhichBrokerId`` = ``whichBrokerWhenConsumeSlowly`` when
``DefaultMessageStore.getMessage`` finds the read further behind than the memory share, with
``slaveReadEnable``; ``PullAPIWrapper.recalculatePullFromWhichNode`` / ``findBrokerAddressInSubscribe``
send the queue's next pull to that node; the slave names the master again once the reader is close to the
end). The consumer gets every message once, and the offsets it commits meanwhile (to the master:
``clearCommitOffsetFlag`` on a slave pull) are kept.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_sim import ConsumeStatus, Message, Producer, PushConsumer
from broker_sim.common.message import MessageExt
from broker_sim.common.requests import ConsumeFromWhere, PullMessageRequest
from broker_sim.remoting.client_transport import RemotingTransport
from broker_sim.remoting.serve import BrokerSimServer, ServeConfig
from tests.waiting import wait_until

TOPIC = "SlowT"
#: the broker's "machine memory": 40 % of it (8 000 bytes, ~8 records) is the in-memory share
MEMORY = 20_000
BACKLOG = 120
SMALL = {"commit_log_file_size": 4 * 1024 * 1024, "index_hash_slots": 1024, "index_max_entries": 8192}


@pytest.fixture
def group(tmp_path: Path) -> Iterator[tuple[BrokerSimServer, BrokerSimServer, str]]:
    """A name server, broker-a's master and its slave, all with ``slaveReadEnable`` and a small memory."""
    started: list[BrokerSimServer] = []

    def start(config: ServeConfig) -> BrokerSimServer:
        srv = BrokerSimServer(config)
        srv.start()
        started.append(srv)
        return srv

    ns = start(ServeConfig(store_dir=tmp_path, namesrv_port=0, run_broker=False)).namesrv_address
    common = {"topics": {TOPIC: 2}, "slave_read_enable": True, "total_physical_memory_bytes": MEMORY, **SMALL}

    def broker(bid: int, role: str, **extra: Any) -> BrokerSimServer:
        cfg = {**common, "broker_role": role, "broker_id": bid, **extra}
        return start(
            ServeConfig(
                store_dir=tmp_path / f"a{bid}", broker_port=0, broker_name="broker-a", run_namesrv=False,
                namesrv_addrs=[ns], broker_config=cfg,
            )
        )  # fmt: skip

    master = broker(0, "ASYNC_MASTER", ha_listen_port=0)
    slave = broker(1, "SLAVE")
    try:
        yield master, slave, ns
    finally:
        for srv in reversed(started):
            srv.shutdown()


class PullSpy(RemotingTransport):
    """The real TCP transport, recording the node each pull was sent to."""

    def __init__(self, namesrv: str) -> None:
        super().__init__(namesrv)
        self.targets: list[str] = []
        route = self.locator.pull_target

        def recorded(request: PullMessageRequest) -> tuple[str, PullMessageRequest]:
            addr, sent = route(request)
            self.targets.append(addr)
            return addr, sent

        self.locator.pull_target = recorded  # type: ignore[method-assign]


def test_a_slow_reader_moves_to_the_slave_gets_everything_once_and_keeps_its_offsets(
    group: tuple[BrokerSimServer, BrokerSimServer, str],
) -> None:
    master_srv, slave_srv, ns = group
    master, slave = master_srv.broker, slave_srv.broker
    assert master is not None and slave is not None
    producer = Producer(ns, "P")
    bodies = [f"m{i:04d}".encode() + b"x" * 1000 for i in range(BACKLOG)]
    for b in bodies:
        producer.send(Message(TOPIC, b))
    assert wait_until(lambda: slave.store.max_phy_offset == master.store.max_phy_offset)

    seen: Counter[bytes] = Counter()
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            seen.update(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    spy = PullSpy(ns)
    consumer = PushConsumer(
        spy, "CG", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, pull_batch_size=8
    )
    consumer.subscribe(TOPIC, "*", listener)
    try:
        consumer.start()
        assert wait_until(lambda: sum(seen.values()) >= BACKLOG)
        # the first pull of each queue went to the master, which sent the backlog's reader to the slave
        assert spy.targets[0] == master_srv.broker_address
        assert slave_srv.broker_address in spy.targets
        # the slave sent the reader back once it was close to the end: the last pulls are the master's
        assert wait_until(lambda: spy.targets[-1] == master_srv.broker_address)
        with lock:
            assert seen == Counter(bodies)  # every message, once
        consumer.persist_offsets()

        def committed() -> int:
            return sum(p.consumer_offset for p in master.consumer_progress("CG", TOPIC))

        assert wait_until(lambda: committed() == BACKLOG)
    finally:
        consumer.shutdown()

    # a new consumer of the group resumes from those offsets: it reads only what is new
    fresh: list[bytes] = []
    again = PushConsumer(ns, "CG", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)

    def collect(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            fresh.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    again.subscribe(TOPIC, "*", collect)
    try:
        again.start()
        for i in range(4):
            producer.send(Message(TOPIC, f"new{i}".encode()))
        assert wait_until(lambda: len(fresh) >= 4)
        with lock:
            assert sorted(fresh) == [f"new{i}".encode() for i in range(4)]
    finally:
        again.shutdown()
        producer.shutdown()
