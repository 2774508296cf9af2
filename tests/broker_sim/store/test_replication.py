"""Commit-log replication between two stores over the HA port (RocketMQ 4.9.8 ``HAService``,
``HAConnection``, ``HAClient``, ``CommitLog.submitReplicaRequest``): the slave's commit log is a byte copy
of the master's, and its own consume queues and index are built from it."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from broker_sim.store import MessageStore
from broker_sim.store.config import BrokerRole
from broker_sim.store.ha.protocol import ACK
from broker_sim.store.results import PutMessageStatus
from tests.broker_sim.store.conftest import StoreFactory, msg
from tests.waiting import wait_until


def pair(make_store: StoreFactory, tmp_path: Path, role: BrokerRole) -> tuple[MessageStore, MessageStore]:
    master = make_store(tmp_path / "master", broker_role=role, ha_listen_port=0)
    slave = make_store(
        tmp_path / "slave",
        broker_role=BrokerRole.SLAVE,
        ha_master_address=master.replication.ha_address,
    )
    service = master.replication.service
    assert service is not None
    # connected is not enough: a slave reporting 0 is sent from the segment the master writes when its
    # first report arrives, so puts made before that could fall into a segment it never receives
    assert wait_until(lambda: service.streaming == 1)
    return master, slave


def test_slave_holds_the_masters_bytes_and_serves_them_from_its_own_queues(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    """Records cross segment ends (8 KiB segments, BLANK markers) and come out of the slave's consume
    queue and index like the master's."""
    master, slave = pair(make_store, tmp_path, BrokerRole.ASYNC_MASTER)
    for i in range(60):
        assert master.put_message(msg(body=b"x" * 300 + str(i).encode(), queue_id=i % 2, KEYS=f"k{i}")).ok
    assert wait_until(lambda: slave.get_max_offset_in_queue("TopicA", 0) == 30)
    assert wait_until(lambda: slave.get_max_offset_in_queue("TopicA", 1) == 30)
    assert slave.max_phy_offset == master.max_phy_offset
    assert len(master.commit_log.mfq.files) > 2
    for mf_m, mf_s in zip(master.commit_log.mfq.files, slave.commit_log.mfq.files, strict=True):
        assert bytes(mf_m.mm[: mf_m.wrote]) == bytes(mf_s.mm[: mf_s.wrote])
    got = slave.get_message("G", "TopicA", 1, 0, 32)
    assert [m.ext.body for m in got.messages][:2] == [b"x" * 300 + b"1", b"x" * 300 + b"3"]
    assert [m.ext.body for m in slave.query_message("TopicA", "k7", 5).messages] == [b"x" * 300 + b"7"]


def test_sync_master_acknowledges_only_what_a_slave_has(make_store: StoreFactory, tmp_path: Path) -> None:
    """SYNC_MASTER: PUT_OK once a slave acknowledged the end offset; without a slave the message is
    stored but the put says SLAVE_NOT_AVAILABLE (CommitLog.handleHA / HAService.isSlaveOK)."""
    alone = make_store(tmp_path / "alone", broker_role=BrokerRole.SYNC_MASTER, ha_listen_port=0)
    r = alone.put_message(msg())
    assert r.status is PutMessageStatus.SLAVE_NOT_AVAILABLE and r.append_result is not None
    master, slave = pair(make_store, tmp_path, BrokerRole.SYNC_MASTER)
    assert wait_until(
        lambda: master.replication.service is not None and master.replication.service.slaves == 1
    )
    for i in range(20):
        r = master.put_message(msg(body=f"m{i}".encode()))
        assert r.status is PutMessageStatus.PUT_OK
        assert r.append_result is not None
        assert slave.max_phy_offset >= r.append_result.wrote_offset + r.append_result.wrote_bytes


def test_a_new_slave_gets_the_masters_last_segment_only(make_store: StoreFactory, tmp_path: Path) -> None:
    """HAConnection.WriteSocketService: a slave reporting offset 0 is sent from the start of the master's
    last commit-log segment; older history is not replicated."""
    master = make_store(tmp_path / "master", ha_listen_port=0)
    for i in range(60):
        master.put_message(msg(body=b"x" * 300 + str(i).encode()))
    last = master.commit_log.mfq.files[-1].file_from_offset
    assert last > 0
    slave = make_store(
        tmp_path / "slave", broker_role=BrokerRole.SLAVE, ha_master_address=master.replication.ha_address
    )
    assert wait_until(lambda: slave.max_phy_offset == master.max_phy_offset)
    assert slave.commit_log.min_offset == last


def test_a_slave_refuses_puts(make_store: StoreFactory, tmp_path: Path) -> None:
    """DefaultMessageStore.putMessage: a SLAVE answers SERVICE_NOT_AVAILABLE."""
    slave = make_store(tmp_path / "s", broker_role=BrokerRole.SLAVE, ha_master_address="")
    assert slave.put_message(msg()).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert slave.put_messages([msg()]).status is PutMessageStatus.SERVICE_NOT_AVAILABLE


def test_a_slave_that_restarts_continues_from_its_own_end(make_store: StoreFactory, tmp_path: Path) -> None:
    master, slave = pair(make_store, tmp_path, BrokerRole.ASYNC_MASTER)
    for i in range(10):
        master.put_message(msg(body=f"a{i}".encode()))
    assert wait_until(lambda: slave.max_phy_offset == master.max_phy_offset)
    slave.shutdown()
    for i in range(10):
        master.put_message(msg(body=f"b{i}".encode()))
    again = make_store(
        tmp_path / "slave", broker_role=BrokerRole.SLAVE, ha_master_address=master.replication.ha_address
    )
    assert wait_until(lambda: again.get_max_offset_in_queue("TopicA", 0) == 20)
    bodies = [m.ext.body for m in again.get_message("G", "TopicA", 0, 0, 32).messages]
    bodies += [m.ext.body for m in again.get_message("G", "TopicA", 0, len(bodies), 32).messages]
    assert bodies == [f"a{i}".encode() for i in range(10)] + [f"b{i}".encode() for i in range(10)]


def test_a_sync_put_waiting_on_a_slave_that_goes_away_reports_slave_not_available(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    """A SYNC_MASTER put waiting for the acknowledgement of a slave that then disconnects answers
    SLAVE_NOT_AVAILABLE as soon as the connection is gone, not after ``syncFlushTimeout`` (a producer's
    own 3 s send timeout would run out first and the send would look failed although it was stored)."""
    master = make_store(
        tmp_path / "master",
        broker_role=BrokerRole.SYNC_MASTER,
        ha_listen_port=0,
        sync_flush_timeout_ms=120_000,
    )
    service = master.replication.service
    assert service is not None
    host, port = master.replication.ha_address.rsplit(":", 1)
    silent = socket.create_connection((host, int(port)))  # acknowledges once, then never again
    silent.sendall(ACK.pack(master.max_phy_offset))
    assert wait_until(lambda: service.slaves == 1)
    before = master.max_phy_offset
    results: list[PutMessageStatus] = []
    put = threading.Thread(target=lambda: results.append(master.put_message(msg()).status), daemon=True)
    put.start()
    assert wait_until(lambda: master.max_phy_offset > before)  # stored; now waiting for the slave
    silent.close()
    put.join(timeout=30)
    assert not put.is_alive()
    assert results == [PutMessageStatus.SLAVE_NOT_AVAILABLE]
