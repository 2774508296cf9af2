"""A master's power cut under each flush × replication mode, with a producer and a push consumer running
(the seed's availability table). Each broker is its own process; SIGUSR1 cuts its power (unflushed data
lost). Facts from RocketMQ 4.9.8: ``CommitLog.handleHA`` / ``HAService.isSlaveOK`` (a SYNC_MASTER
acknowledges only what a slave has), ``MQClientInstance.findBrokerAddressInSubscribe`` (pulls and offset
commits go to the slave when the master is not in the route), ``DefaultMQProducerImpl.sendDefaultImpl`` /
``MQFaultStrategy`` (a failed group is skipped on retry), ``SlaveSynchronize`` (the slave's offsets).

Times are recorded (printed, and in docs/broker_sim-ha.md), never asserted.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from broker_sim import ConsumeStatus, Message, Producer, PushConsumer
from broker_sim.client.message import SendStatus
from broker_sim.common.errors import ServiceNotAvailableError
from broker_sim.common.message import MessageExt
from broker_sim.common.requests import ConsumeFromWhere, SendMessageRequest
from broker_sim.faults import FaultInjector
from broker_sim.remoting.admin_client import AdminClient
from broker_sim.remoting.client_codec import send_fields, send_response
from broker_sim.remoting.client_transport import RemotingTransport
from broker_sim.remoting.cluster_process import ClusterProcess
from broker_sim.remoting.codes import RequestCode
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
TOPIC = "HaT"


class Deliveries:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: Counter[bytes] = Counter()
        self.first_seen: dict[bytes, float] = {}

    def listener(self, msgs: list[MessageExt]) -> ConsumeStatus:
        with self.lock:
            for m in msgs:
                self.count[m.body] += 1
                self.first_seen.setdefault(m.body, time.monotonic())
        return ConsumeStatus.CONSUME_SUCCESS

    def seen(self) -> set[bytes]:
        with self.lock:
            return set(self.count)


def send_all(producer: Producer, prefix: str, n: int) -> dict[bytes, tuple[str, int, int]]:
    """Send ``n`` messages; the acknowledged ones (SEND_OK) with where they landed."""
    acked: dict[bytes, tuple[str, int, int]] = {}
    for i in range(n):
        body = f"{prefix}{i}".encode()
        try:
            r = producer.send(Message(TOPIC, body))
        except Exception:  # not acknowledged: the producer reports the failure to its caller
            continue
        if r.status is SendStatus.SEND_OK:
            acked[body] = (r.broker_name, r.queue_id, r.queue_offset)
    return acked


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
@pytest.mark.parametrize("replication", ["async", "sync"])
def test_master_power_cut(tmp_path: Path, flush: str, replication: str) -> None:
    topics = json.dumps({TOPIC: 4})
    cluster = ClusterProcess(
        tmp_path, brokers=2, slaves=1, replication=replication, flush=flush, extra=(f"--set=topics={topics}",)
    )
    deliveries = Deliveries()
    with cluster:
        producer = Producer(cluster.namesrv, "HaPG", send_latency_fault_enable=True)
        consumer = PushConsumer(
            cluster.namesrv,
            "HaCG",
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            persist_consumer_offset_interval_ms=500,
            pull_time_delay_ms_when_exception=200,
        )
        consumer.subscribe(TOPIC, "*", deliveries.listener)
        consumer.start()
        probe = RemotingTransport(cluster.namesrv)
        try:
            acked = send_all(producer, "before", 150)
            assert {where[0] for where in acked.values()} == {"broker-a", "broker-b"}
            # a second producer is mid-burst when the power goes: its last acknowledged sends may not
            # have reached the slave yet (ASYNC_MASTER's window)
            burst_acked: dict[bytes, tuple[str, int, int]] = {}
            stop_burst = threading.Event()
            burster = Producer(cluster.namesrv, "HaBurstPG", send_latency_fault_enable=True)

            def burst() -> None:
                i = 0
                while not stop_burst.is_set():
                    burst_acked.update(send_all(burster, f"burst{i}-", 1))
                    i += 1

            burst_thread = threading.Thread(target=burst, name="burst")
            burst_thread.start()
            assert wait_until(lambda: len(burst_acked) >= 20)
            cut = time.monotonic()
            faults = FaultInjector()
            faults.lose_master(cluster, "broker-a")
            assert faults.summary() == {"MASTER_LOST": 1}
            stop_burst.set()
            burst_thread.join(timeout=60)
            burster.shutdown()
            acked |= burst_acked
            # what the slave holds is all a consumer can still read of broker-a (once it dispatched it all)
            admin = AdminClient(cluster.namesrv)
            slave_addr = cluster.node("broker-a", 1).address
            try:
                assert wait_until(lambda: admin.runtime_info(slave_addr)["dispatchBehindBytes"] == "0")
            finally:
                admin.close()
            slave_max = {q: probe.get_max_offset(TOPIC, q, "broker-a") for q in range(4)}
            unreplicated = {
                b for b, (name, q, off) in acked.items() if name == "broker-a" and off >= slave_max[q]
            }
            # a consumer starting during the outage reads broker-a's messages from the slave
            late_group = Deliveries()
            latecomer = PushConsumer(
                cluster.namesrv, "HaLateCG", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
            )
            latecomer.subscribe(TOPIC, "*", late_group.listener)
            latecomer.start()
            on_a = {b for b, where in acked.items() if where[0] == "broker-a"} - unreplicated
            try:
                assert wait_until(lambda: on_a <= late_group.seen(), timeout=60)
            finally:
                latecomer.shutdown()
            resumed_s = max(late_group.first_seen[b] for b in on_a) - cut
            after = send_all(producer, "during", 60)
            assert len(after) == 60, "the producer must keep going on the other group"
            assert {where[0] for where in after.values()} == {"broker-b"}
            acked |= after
            readable = set(acked) - unreplicated
            assert wait_until(lambda: readable <= deliveries.seen(), timeout=60)
            lost = set(acked) - deliveries.seen()
            assert lost <= unreplicated
            if replication == "sync":
                assert unreplicated == set() and lost == set()
            # offsets committed to the slave while the master is down survive its return
            assert wait_until(lambda: probe.query_consumer_offset("HaCG", TOPIC, 0, "broker-a") is not None)
            on_slave = {q: probe.query_consumer_offset("HaCG", TOPIC, q, "broker-a") or 0 for q in range(4)}
            restart = time.monotonic()
            cluster.restart("broker-a")
            late = send_all(producer, "after", 40)
            acked |= late
            assert wait_until(lambda: set(late) <= deliveries.seen(), timeout=60)
            back_s = time.monotonic() - restart
            consumer.persist_offsets()

            def master_offsets_kept() -> bool:
                return all(
                    (probe.query_consumer_offset("HaCG", TOPIC, q, "broker-a") or 0) >= on_slave[q]
                    for q in range(4)
                )

            assert wait_until(master_offsets_kept, timeout=30)
            duplicates = sum(n - 1 for n in deliveries.count.values())
            print(
                f"\nHA {flush} {replication.upper()}_MASTER: acked={len(acked)} "
                f"unreplicated={len(unreplicated)} lost={len(lost)} duplicates={duplicates} "
                f"resume_from_slave={resumed_s:.1f}s "
                f"after_restart={back_s:.1f}s"
            )
        finally:
            consumer.shutdown()
            producer.shutdown()
            probe.close()


def test_sync_master_without_its_slave_reports_slave_not_available(tmp_path: Path) -> None:
    """HAService.isSlaveOK: with its only slave gone a SYNC_MASTER still stores the message but answers
    SLAVE_NOT_AVAILABLE (11), which the producer reports as that SendStatus (retryAnotherBrokerWhenNotStoreOK
    is off by default); once the slave is back, SEND_OK again. A slave refuses sends itself."""
    topics = json.dumps({TOPIC: 2})
    with ClusterProcess(
        tmp_path, brokers=1, slaves=1, replication="sync", extra=(f"--set={'topics=' + topics}",)
    ) as c:
        producer = Producer(c.namesrv, "HaPG")
        try:
            assert producer.send(Message(TOPIC, b"replicated")).status is SendStatus.SEND_OK
            c.node("broker-a", 1).process.kill()
            statuses = [producer.send(Message(TOPIC, f"alone{i}".encode())).status for i in range(3)]
            assert statuses == [SendStatus.SLAVE_NOT_AVAILABLE] * 3
            c.restart("broker-a", 1)
            assert wait_until(
                lambda: producer.send(Message(TOPIC, b"again")).status is SendStatus.SEND_OK, timeout=30
            )
        finally:
            producer.shutdown()
        slave = RemotingTransport(c.node("broker-a", 1).address)
        try:
            with pytest.raises(ServiceNotAvailableError):
                send_response(
                    slave._invoke(
                        c.node("broker-a", 1).address,
                        slave._req(
                            RequestCode.SEND_MESSAGE,
                            send_fields(SendMessageRequest("P", TOPIC, 0)),
                            b"x",
                        ),
                    )
                )
        finally:
            slave.close()
