"""broker_sim's own clients over TCP (``Producer("host:port", group)`` …) against the remoting server."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from broker_sim import ConsumeStatus, Message, Producer, PullConsumer, PushConsumer
from broker_sim.client.transaction_producer import TransactionProducer
from broker_sim.common.errors import TopicNotExistError, TransportError
from broker_sim.common.message import ConsumeOrderlyStatus, LocalTransactionState, MessageExt, MessageQueue
from broker_sim.common.requests import ConsumeFromWhere, MessageModel, PullStatus
from broker_sim.remoting.client_transport import RemotingTransport
from tests.broker_sim.remoting.conftest import FAST_DELAYS, ServerFactory, running_broker
from tests.waiting import wait_until


def test_produce_push_consume_and_progress(serve: ServerFactory) -> None:
    srv = serve(topics={"T": 4})
    broker = running_broker(srv)
    ns = srv.namesrv_address
    producer = Producer(ns, "PG")
    results = [producer.send(Message("T", f"m{i}".encode(), keys=f"k{i}", tags="A")) for i in range(40)]
    assert {r.queue_id for r in results} == {0, 1, 2, 3}
    assert all(len(r.offset_msg_id) == 32 for r in results)
    seen: dict[bytes, MessageExt] = {}
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            for m in msgs:
                seen[m.body] = m
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(ns, "CG", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe("T", "*", listener)
    consumer.start()
    try:
        assert wait_until(lambda: len(seen) == 40)
        m7 = seen[b"m7"]
        assert (m7.topic, m7.key_list, m7.tags) == ("T", ["k7"], "A")
        assert m7.msg_id == results[7].msg_id and m7.offset_msg_id == results[7].offset_msg_id
        # a message produced while the consumer's pulls are held is delivered through long polling
        producer.send(Message("T", b"late"))
        assert wait_until(lambda: b"late" in seen)
        consumer.persist_offsets()
        assert wait_until(lambda: sum(p.lag for p in broker.consumer_progress("CG", "T")) == 0)
        assert sum(p.broker_offset for p in broker.consumer_progress("CG", "T")) == 41
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_pull_consumer_batch_view_and_query(serve: ServerFactory) -> None:
    srv = serve(topics={"T": 2})
    broker = running_broker(srv)
    ns = srv.namesrv_address
    producer = Producer(ns, "PG")
    mq = MessageQueue("T", "broker-a", 1)
    batch = producer.send_batch([Message("T", f"b{i}".encode(), keys=f"bk{i}") for i in range(5)], queue=mq)
    assert batch.queue_id == 1
    assert wait_until(lambda: broker.get_max_offset("T", 1) == 5)  # consume queues dispatch asynchronously
    pull = PullConsumer(ns, "PullG")
    pull.start()
    try:
        queues = pull.fetch_subscribe_message_queues("T")
        assert queues == [MessageQueue("T", "broker-a", 0), mq]
        res = pull.pull(mq, "*", 0)
        assert res.status is PullStatus.FOUND
        assert [m.body for m in res.msgs] == [f"b{i}".encode() for i in range(5)]
        assert [m.queue_offset for m in res.msgs] == [0, 1, 2, 3, 4]
        assert pull.pull(mq, "*", res.next_begin_offset).status is PullStatus.NO_NEW_MSG
        assert pull.pull(mq, "*", 99).status is PullStatus.OFFSET_ILLEGAL
        # lookups go over the wire too
        t = RemotingTransport(ns)
        try:
            viewed = t.view_message_by_id(res.msgs[2].offset_msg_id)
            assert viewed.body == b"b2" and viewed.store_host == srv.broker_address
            assert t.get_max_offset("T", 1) == 5 and t.get_min_offset("T", 1) == 0
            assert t.search_offset_by_timestamp("T", 1, 0) == 0
            assert t.query_consumer_offset("NewGroup", "T", 1) == 0  # G13: min offset 0 → 0, not 22
            with pytest.raises(TopicNotExistError):
                t.get_route("NoSuchTopic")
            route = t.get_route("%RETRY%AnyGroup")  # G11
            assert route.queue_datas[0].read_queue_nums == 1
        finally:
            t.close()
    finally:
        pull.shutdown()
        producer.shutdown()


def test_retry_then_dlq_over_tcp(serve: ServerFactory) -> None:
    srv = serve(topics={"T": 1}, max_reconsume_times=2, message_delay_level=FAST_DELAYS)
    broker = running_broker(srv)
    ns = srv.namesrv_address
    producer = Producer(ns, "PG")
    sent = producer.send(Message("T", b"poison", keys="p1"))
    attempts: list[int] = []

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        attempts.extend(m.reconsume_times for m in msgs)
        return ConsumeStatus.RECONSUME_LATER

    # the client's own limit travels in CONSUMER_SEND_MSG_BACK (maxReconsumeTimes), as with Java clients
    consumer = PushConsumer(
        ns, "CG", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, max_reconsume_times=2
    )
    consumer.subscribe("T", "*", listener)
    consumer.start()
    try:
        assert wait_until(lambda: len(broker.dlq_messages("CG")) == 1, timeout=30)
        (dead,) = broker.dlq_messages("CG")
        assert dead.body == b"poison" and dead.msg_id == sent.msg_id
        assert dead.properties["RETRY_TOPIC"] == "T"
        assert attempts == [0, 1, 2]
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_transaction_check_back_over_tcp(serve: ServerFactory) -> None:
    srv = serve(topics={"T": 1}, transaction_check_interval_ms=100, transaction_timeout_ms=0)
    broker = running_broker(srv)
    ns = srv.namesrv_address
    checked = threading.Event()

    def executor(msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def checker(msg: MessageExt) -> LocalTransactionState:
        checked.set()
        return LocalTransactionState.COMMIT_MESSAGE

    producer = TransactionProducer(ns, "TxPG", executor, checker)
    try:
        result = producer.send_message_in_transaction(Message("T", b"tx"))
        assert result.local_transaction_state is LocalTransactionState.UNKNOW
        assert broker.messages("T") == []  # half message invisible
        assert checked.wait(20)  # CHECK_TRANSACTION_STATE reached us over the connection
        assert wait_until(lambda: [m.body for m in broker.messages("T")] == [b"tx"])
    finally:
        producer.shutdown()


def test_acl_over_tcp(serve: ServerFactory) -> None:
    srv = serve(acl={"ak": "sk"}, topics={"T": 1})
    good = RemotingTransport(srv.namesrv_address, access_key="ak", secret_key="sk")
    bad = RemotingTransport(srv.namesrv_address, access_key="ak", secret_key="wrong")
    try:
        assert good.get_max_offset("T", 0) == 0
        with pytest.raises(Exception, match="signature"):
            bad.get_max_offset("T", 0)
    finally:
        good.close()
        bad.close()


def test_server_gone_is_a_transport_error(serve: ServerFactory) -> None:
    srv = serve(topics={"T": 1})
    t = RemotingTransport(srv.namesrv_address)
    assert t.get_max_offset("T", 0) == 0
    srv.shutdown()
    with pytest.raises(TransportError):
        t.get_max_offset("T", 0)
    t.close()


def test_orderly_consumption_takes_queue_locks_over_tcp(serve: ServerFactory) -> None:
    srv = serve(topics={"T": 2})
    broker = running_broker(srv)
    ns = srv.namesrv_address
    producer = Producer(ns, "PG")
    for i in range(20):
        producer.send_orderly(Message("T", f"{i % 2}:{i}".encode()), sharding_key=str(i % 2))
    seen: dict[int, list[int]] = {0: [], 1: []}

    def listener(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        for m in msgs:
            key, n = m.body.decode().split(":")
            seen[int(key)].append(int(n))
        return ConsumeOrderlyStatus.SUCCESS

    consumer = PushConsumer(ns, "OrdG", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe("T", "*")
    consumer.register_message_listener_orderly(listener)
    consumer.start()
    try:
        assert wait_until(lambda: len(seen[0]) + len(seen[1]) == 20)
        assert seen[0] == list(range(0, 20, 2)) and seen[1] == list(range(1, 20, 2))  # per key, in send order
        held = broker.locks.try_lock_batch("OrdG", set(consumer.assigned_queues()), "someone-else")
        assert held == set()  # the queues are locked by our consumer (LOCK_BATCH_MQ over the wire)
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_broadcasting_delivers_everything_to_every_consumer(serve: ServerFactory, tmp_path: Path) -> None:
    srv = serve(topics={"T": 2})
    ns = srv.namesrv_address
    seen: list[set[bytes]] = [set(), set()]
    consumers = []
    for i in range(2):

        def listener(msgs: list[MessageExt], mine: set[bytes] = seen[i]) -> ConsumeStatus:
            mine.update(m.body for m in msgs)
            return ConsumeStatus.CONSUME_SUCCESS

        c = PushConsumer(
            ns,
            "BcG",
            message_model=MessageModel.BROADCASTING,
            instance_name=f"bc{i}",
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            local_offset_dir=tmp_path,
        )
        c.subscribe("T", "*", listener)
        c.start()
        consumers.append(c)
    producer = Producer(ns, "PG")
    try:
        for i in range(10):
            producer.send(Message("T", f"b{i}".encode()))
        want = {f"b{i}".encode() for i in range(10)}
        assert wait_until(lambda: seen[0] == want and seen[1] == want)
    finally:
        producer.shutdown()
        for c in consumers:
            c.shutdown()
    assert list(tmp_path.rglob("*.json"))  # broadcasting offsets are kept locally, per instance


def test_undecodable_replies_are_transport_errors() -> None:
    """A peer that answers with garbage (not broker_sim) surfaces as TransportError, per the contract."""
    from broker_sim.remoting.codes import RequestCode
    from broker_sim.remoting.frame import RemotingCommand
    from broker_sim.remoting.server import Connection, RemotingServer

    def bad_route(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return cmd.reply(0, body=b"{not json")

    def bad_offset(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return cmd.reply(0, ext_fields={"offset": "twelve"})

    fake = RemotingServer(
        {RequestCode.GET_ROUTEINFO_BY_TOPIC: bad_route, RequestCode.GET_MAX_OFFSET: bad_offset}
    )
    fake.start()
    cluster = json.dumps({"brokerAddrTable": {"b": {"brokerAddrs": {"0": fake.address}}}}).encode()
    fake.handlers[RequestCode.GET_BROKER_CLUSTER_INFO] = lambda cmd, conn: cmd.reply(
        0, body=cluster
    )  # also "the broker"
    t = RemotingTransport(fake.address)
    try:
        with pytest.raises(TransportError, match="undecodable"):
            t.get_route("T")
        with pytest.raises(TransportError, match="undecodable"):
            t.get_max_offset("T", 0)
    finally:
        t.close()
        fake.shutdown()
