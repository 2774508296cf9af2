"""The RocketMQ adapter with the real client (PyPI ``rocketmq`` 0.4.4) against ``broker-sim serve``.

Nothing here is simulated on the client side: the C++ client resolves routes through the name server, sends
with ``send_orderly`` (our queue selector), pulls, commits offsets and sends failed messages back, all over
RocketMQ's wire protocol, and the guard writes to a real SQLite database.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from reliable import Reliability
from reliable.adapters.rocketmq import (
    RocketMQSender,
    consume_status,
    push_consumer,
    subscribe_guarded,
)
from reliable.decorator import idempotent_consumer
from reliable.demo import ledger
from reliable.demo.services import BrokerServer
from reliable.models import MessageLog, MessageStub
from reliable.producer import StubProducer
from reliable.sender import OutgoingMessage
from reliable.types import ConsumeResult, Envelope, StubStatus
from tests.clusters import ClusterFactory
from tests.clusters import cluster as cluster  # the fixture
from tests.waiting import wait_until

TOPIC = "RmqAdapterT"
ENV = Envelope("m-1", TOPIC, 0, 0, b"{}")


def test_consume_status_never_acks_a_failure() -> None:
    def raising(env: Envelope) -> ConsumeResult:
        raise RuntimeError("handler bug")

    dead: list[str] = []
    assert consume_status(lambda e: ConsumeResult.SUCCESS, ENV) == 0
    assert consume_status(lambda e: ConsumeResult.RECONSUME_LATER, ENV) == 1
    assert consume_status(raising, ENV) == 1
    assert consume_status(lambda e: ConsumeResult.DEAD_LETTER, ENV) == 1  # no action: the broker's DLQ path
    assert (
        consume_status(lambda e: ConsumeResult.DEAD_LETTER, ENV, lambda e: dead.append(e.message_id or ""))
        == 0
    )
    assert dead == ["m-1"]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[BrokerServer]:
    topics = json.dumps({TOPIC: 4})
    srv = BrokerServer(
        tmp_path / "store",
        tmp_path / "logs",
        ["--set", f"topics={topics}", "--set", "message_delay_level=1s 1s 1s 1s", "--log-level", "WARNING"],
    )
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def rel(tmp_path: Path) -> Iterator[Reliability]:
    r = Reliability(f"sqlite:///{tmp_path / 'rmq.db'}", None, lease_ms=2000)
    r.create_schema()
    ledger.reset(r.engine, 10)
    yield r
    r.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_real_client_through_the_guard(server: BrokerServer, rel: Reliability) -> None:
    from broker_sim.client.transport import transport_for

    sender = RocketMQSender.connect(server.address, "rmq_adapter_p")
    consumer = None
    try:
        # stub-first producer over the real client: receipts name the queue and offset the broker assigned
        orders = ledger.make_orders("r", 24, 10, seed=5)
        producer = StubProducer(rel, sender, default_group="rmq_adapter_g")
        with producer.transaction() as tx:
            for o in orders:
                tx.stage(o.order_id, TOPIC, o.to_body())
        receipts = [r.receipt for r in tx.results]
        assert all(r is not None for r in receipts)
        per_queue: dict[int, list[int]] = {}
        for r in receipts:
            assert r is not None
            per_queue.setdefault(r.queue_id, []).append(r.queue_offset)
        assert sorted(per_queue) == [0, 1, 2, 3]
        admin = transport_for(server.address)
        for qid, offsets in per_queue.items():
            assert sorted(offsets) == list(range(len(offsets)))  # the recorded queue id is the real one
            assert admin.get_max_offset(TOPIC, qid) == len(offsets)
        admin.close()
        # a second copy of one order (a producer double-send): the guard must suppress it
        sender.send(OutgoingMessage(orders[0].order_id, TOPIC, orders[0].to_body(), send_count=1))
        # the sweeper's targeted resend of another order: to the group's retry topic, seen by the probe
        targeted = sender.send(
            OutgoingMessage(orders[1].order_id, TOPIC, orders[1].to_body(), target_group="rmq_adapter_g")
        )
        assert sender.max_offset(RETRY, targeted.queue_id) == targeted.queue_offset + 1
        assert sum(sender.max_offset(TOPIC, q) or 0 for q in range(4)) == 24 + 1  # + the double-send
        assert [sender.min_offset(TOPIC, q) for q in range(4)] == [0, 0, 0, 0]  # GET_MIN_OFFSET: none deleted

        failed_once: set[str] = set()
        guarded = idempotent_consumer(rel, group="rmq_adapter_g")(ledger.make_business_handler("rmq"))

        def handler(env: Envelope) -> ConsumeResult:
            # the first delivery of one order fails: it must come back through %RETRY% with reconsume_times 1
            if env.message_id == orders[5].order_id and env.message_id not in failed_once:
                failed_once.add(env.message_id)
                return ConsumeResult.RECONSUME_LATER
            return guarded(env)

        consumer = push_consumer(server.address, "rmq_adapter_g", thread_count=2)
        subscribe_guarded(consumer, TOPIC, handler, group="rmq_adapter_g")
        consumer.start()

        def confirmed() -> int:
            with rel.engine.connect() as conn:
                return int(
                    conn.execute(
                        select(func.count()).where(MessageStub.status == StubStatus.CONFIRMED)
                    ).scalar_one()
                )

        wait_until(lambda: confirmed() == 24, what="24 confirmed stubs")
        with rel.engine.connect() as conn:
            retried = (
                conn.execute(
                    select(MessageLog.reconsume_times).where(MessageLog.message_id == orders[5].order_id)
                )
                .scalars()
                .all()
            )
            copies = conn.execute(
                select(func.count()).where(MessageLog.message_id == orders[0].order_id)
            ).scalar_one()
        assert 1 in retried
        # the retry (its first delivery never reached the guard) and the targeted copy are journaled where
        # they were delivered from, with the original topic beside it
        assert _delivered(rel, orders[5].order_id) == {(RETRY, TOPIC)}
        wait_until(lambda: (RETRY, TOPIC) in _delivered(rel, orders[1].order_id), what="the targeted copy")
        wait_until(lambda: _log_count(rel, orders[0].order_id) == 2, what="the duplicate copy")
        assert copies >= 1
        assert ledger.check(rel.engine, [o.order_id for o in orders], 10).ok
    finally:
        if consumer is not None:
            consumer.shutdown()
        sender.close()


def _log_count(rel: Reliability, message_id: str) -> int:
    with rel.engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(MessageLog.message_id == message_id)).scalar_one())


RETRY = "%RETRY%rmq_adapter_g"


def _delivered(rel: Reliability, message_id: str) -> set[tuple[str, str | None]]:
    with rel.engine.connect() as conn:
        rows = conn.execute(
            select(MessageLog.topic, MessageLog.original_topic).where(MessageLog.message_id == message_id)
        ).all()
    return {(t, o) for t, o in rows}


class Received:
    """The attributes of a ``rocketmq.client.RecvMessage`` as the C++ client fills them (bytes, ints)."""

    def __init__(self, topic: str, queue_id: int, queue_offset: int, props: dict[str, str]) -> None:
        self.topic, self.queue_id, self.queue_offset = topic, queue_id, queue_offset
        self.keys, self.id, self.tags, self.body, self.reconsume_times = b"m-1", "U1", b"", b"{}", 1
        self._props = props

    def get_property(self, name: str) -> bytes | None:
        value = self._props.get(name)
        return None if value is None else value.encode()


def test_envelope_of_a_retry_delivery_names_its_delivered_topic() -> None:
    from reliable.adapters.rocketmq import to_envelope

    # the C++ client restores RETRY_TOPIC as the topic; the copy was stored on the group's retry topic
    restored = to_envelope(Received(TOPIC, 0, 7, {"RETRY_TOPIC": TOPIC}), "g")
    raw = to_envelope(Received("%RETRY%g", 0, 7, {"RETRY_TOPIC": TOPIC}))
    for env in (restored, raw):
        assert (env.topic, env.delivered_topic, env.queue_id, env.queue_offset) == (TOPIC, "%RETRY%g", 0, 7)
    plain = to_envelope(Received(TOPIC, 2, 9, {}), "g")
    assert (plain.topic, plain.delivered_topic, plain.source_topic) == (TOPIC, None, TOPIC)
    with pytest.raises(ValueError):
        to_envelope(Received(TOPIC, 0, 7, {"RETRY_TOPIC": TOPIC}))


@pytest.mark.parametrize(("reconsume_times", "last"), [(0, False), (15, False), (16, True), (17, True)])
def test_the_delivery_at_the_clients_reconsume_limit_is_marked_the_brokers_last(
    reconsume_times: int, last: bool
) -> None:
    """With the group's ``retryMaxTimes`` at 16 (0.4.4 sends no limit of its own) the broker moves a failed
    delivery with ``reconsume_times`` 16 to ``%DLQ%`` instead of retrying it, so the guard must treat its
    failure as final (the broker_sim adapter's test runs that end to end)."""
    from reliable.adapters.rocketmq import to_envelope

    msg = Received(TOPIC, 0, 7, {"RETRY_TOPIC": TOPIC})
    msg.reconsume_times = reconsume_times
    assert to_envelope(msg, "g", max_reconsume_times=16).last_attempt is last
    assert to_envelope(msg, "g").last_attempt is False


def test_receipts_and_deliveries_name_the_broker_group_on_a_two_group_cluster(
    cluster: ClusterFactory,
) -> None:
    """0.4.4 tells neither brokerName nor the store host: the sender maps the index its selector chose
    through the name server's route, and a delivery is named where only one group has its queue id."""
    from reliable.adapters.rocketmq import to_envelope

    c = cluster(topics={"RmqIdT": 2})
    only_b = c.brokers["broker-b"].broker
    assert only_b is not None
    only_b.create_topic("RmqOnlyB", 2)
    sender = RocketMQSender.connect(c.namesrv_addrs[0], "rmq_id_p")
    try:
        receipts = {f"m{i}": sender.send(OutgoingMessage(f"m{i}", "RmqIdT", b"x")) for i in range(8)}
        assert {r.broker_name for r in receipts.values()} == {"broker-a", "broker-b"}
        for message_id, r in receipts.items():  # each receipt names where the broker really stored it
            broker = c.brokers[r.broker_name].broker
            assert broker is not None
            stored = {m.queue_offset: m.keys for m in broker.messages("RmqIdT", r.queue_id)}
            assert stored.get(r.queue_offset) == message_id
            assert (sender.max_offset("RmqIdT", r.queue_id, r.broker_name) or 0) > r.queue_offset
        b = sender.send(OutgoingMessage("b0", "RmqOnlyB", b"x"))
        assert (b.broker_name, b.queue_offset) == ("broker-b", 0)
        assert sender.probe is not None
        book = sender.probe.queues
        assert to_envelope(Received("RmqOnlyB", 1, 0, {}), "g", book).broker_name == "broker-b"
        # queue 1 exists on both groups: the delivery cannot be named (the sweeper then trusts no watermark
        # of that group for named copies, see reliable/sweeper/queues.py)
        assert to_envelope(Received("RmqIdT", 1, 0, {}), "g", book).broker_name == ""
    finally:
        sender.close()
