"""The broker_sim adapter: envelope mapping, result mapping, and the whole path through a real broker_sim
broker (in-process and over TCP via ``broker-sim serve``) into the real guard on SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker_sim.common.message import ConsumeStatus, MessageExt, Prop
from reliable import Reliability
from reliable.adapters.broker_sim import (
    BrokerSimProbe,
    BrokerSimSender,
    GuardedListener,
    message_id_of,
    send_back_to_dlq,
    to_envelope,
)
from reliable.decorator import idempotent_consumer
from reliable.demo import ledger
from reliable.demo.services import BrokerServer
from reliable.errors import SendError
from reliable.models import ConsumeProgress, MessageInbox, MessageLog, MessageStub
from reliable.producer import StubProducer
from reliable.sender import OutgoingMessage
from reliable.types import ConsumeResult, Envelope, StubStatus
from tests.waiting import wait_until

TOPIC = "AdapterT"
GROUP = "adapter_g"


def ext(props: dict[str, str], topic: str = TOPIC, **kw: Any) -> MessageExt:
    return MessageExt(topic=topic, body=b"x", properties=dict(props), **kw)


# --- mapping -------------------------------------------------------------------------------------------


def test_message_id_prefers_keys_then_uniq_key() -> None:
    assert message_id_of(ext({Prop.KEYS: "order-1 other", Prop.UNIQ_KEY: "U1"})) == "order-1"
    assert message_id_of(ext({Prop.UNIQ_KEY: "U1"})) == "U1"
    assert message_id_of(ext({})) is None


RETRY = f"%RETRY%{GROUP}"


def test_a_retry_delivery_keeps_its_delivered_position_and_reports_the_original_topic() -> None:
    props = {Prop.KEYS: "m-1", Prop.RETRY_TOPIC: TOPIC, Prop.TAGS: "A"}
    # as a pull consumer sees it: the %RETRY% topic itself
    pulled = ext(props, topic=RETRY, queue_id=0, queue_offset=7, reconsume_times=2)
    # as the push consumer hands it to a listener: original topic restored, RETRY_TOPIC left in place
    pushed = ext(props, topic=TOPIC, queue_id=0, queue_offset=7, reconsume_times=2)
    for env in (to_envelope(pulled), to_envelope(pushed, GROUP)):
        assert (env.message_id, env.topic, env.reconsume_times, env.tags) == ("m-1", TOPIC, 2, "A")
        # the position is the retry queue's, and says so: it must never pass for queue 0 of the topic
        assert (env.delivered_topic, env.source_topic, env.queue_id, env.queue_offset) == (RETRY, RETRY, 0, 7)
    with pytest.raises(ValueError, match="consumer group"):
        to_envelope(pushed)  # without the group the delivered topic cannot be named: never guess
    plain = to_envelope(ext({Prop.KEYS: "m-2"}, queue_id=3, queue_offset=9))
    assert (plain.topic, plain.delivered_topic, plain.source_topic, plain.queue_id) == (TOPIC, None, TOPIC, 3)


def test_targeted_send_goes_to_the_groups_retry_topic_with_the_original_topic() -> None:
    sent: list[Any] = []

    class Recording:
        def send(self, msg: Any) -> Any:
            sent.append(msg)
            from broker_sim.client.message import SendResult, SendStatus

            return SendResult(SendStatus.SEND_OK, "id", 0, 5, "off")

    sender = BrokerSimSender(Recording())
    sender.send(OutgoingMessage("m-1", TOPIC, b"x", target_group="audit"))
    sender.send(OutgoingMessage("m-2", TOPIC, b"x"))
    assert [(m.topic, m.properties.get(Prop.RETRY_TOPIC)) for m in sent] == [
        ("%RETRY%audit", TOPIC),
        (TOPIC, None),
    ]
    assert sender.resend_topic(TOPIC, "audit") == "%RETRY%audit"


def _listener(
    results: list[ConsumeResult], dead: list[str] | None, fail_dead: bool = False
) -> GuardedListener:
    it = iter(results)

    def handler(env: Envelope) -> ConsumeResult:
        return next(it)

    def dead_letter(msg: MessageExt) -> None:
        if fail_dead:
            raise RuntimeError("broker down")
        assert dead is not None
        dead.append(message_id_of(msg) or "")

    return GuardedListener(handler, dead_letter if dead is not None else None)


@pytest.mark.parametrize(
    ("results", "expected"),
    [
        ([ConsumeResult.SUCCESS], ConsumeStatus.CONSUME_SUCCESS),
        ([ConsumeResult.RECONSUME_LATER], ConsumeStatus.RECONSUME_LATER),
        ([ConsumeResult.SUCCESS, ConsumeResult.RECONSUME_LATER], ConsumeStatus.RECONSUME_LATER),
        ([ConsumeResult.DEAD_LETTER, ConsumeResult.SUCCESS], ConsumeStatus.CONSUME_SUCCESS),
    ],
)
def test_result_mapping(results: list[ConsumeResult], expected: ConsumeStatus) -> None:
    dead: list[str] = []
    msgs = [ext({Prop.KEYS: f"m{i}"}) for i in range(len(results))]
    assert _listener(results, dead)(msgs) is expected
    assert dead == [f"m{i}" for i, r in enumerate(results) if r is ConsumeResult.DEAD_LETTER]


def test_dead_letter_is_never_a_silent_ack() -> None:
    msgs = [ext({Prop.KEYS: "m0"})]
    assert _listener([ConsumeResult.DEAD_LETTER], None)(msgs) is ConsumeStatus.RECONSUME_LATER
    failing = _listener([ConsumeResult.DEAD_LETTER], [], fail_dead=True)
    assert failing(msgs) is ConsumeStatus.RECONSUME_LATER


def test_batch_handler_is_used_for_batches() -> None:
    calls: list[int] = []

    class Handler:
        def __call__(self, env: Envelope) -> ConsumeResult:
            calls.append(1)
            return ConsumeResult.SUCCESS

        def batch(self, envs: list[Envelope]) -> list[ConsumeResult]:
            calls.append(len(envs))
            return [ConsumeResult.SUCCESS] * len(envs)

    listener = GuardedListener(Handler())
    assert listener([ext({Prop.KEYS: "a"}), ext({Prop.KEYS: "b"})]) is ConsumeStatus.CONSUME_SUCCESS
    assert listener([ext({Prop.KEYS: "c"})]) is ConsumeStatus.CONSUME_SUCCESS
    assert calls == [2, 1]


def test_sender_failure_is_a_send_error() -> None:
    class Down:
        def send(self, msg: Any) -> Any:
            raise ConnectionRefusedError("no broker")

    with pytest.raises(SendError, match="no broker"):
        BrokerSimSender(Down()).send(OutgoingMessage("m", TOPIC, b"x"))


# --- through a real broker -----------------------------------------------------------------------------


@pytest.fixture
def rel(sqlite_url: str) -> Iterator[Reliability]:
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    r = Reliability(sqlite_url, None, lease_ms=2000)
    ledger.reset(r.engine, 10)
    yield r
    r.close()


@pytest.fixture(params=["inprocess", pytest.param("tcp", marks=pytest.mark.slow)])
def broker_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    config = {"topics": {TOPIC: 4}, "message_delay_level": "1s 1s 1s", "commit_log_file_size": 8 << 20}
    if request.param == "inprocess":
        from broker_sim.broker.broker import Broker

        broker = Broker(str(tmp_path / "store"), **config)
        broker.start()
        yield broker
        broker.shutdown()
    else:
        import json

        args: list[str] = ["--log-level", "WARNING"]
        for k, v in config.items():
            args += ["--set", f"{k}={json.dumps(v) if isinstance(v, dict) else v}"]
        server = BrokerServer(tmp_path / "store", tmp_path / "logs", args)
        server.start()
        yield server.address
        server.stop()


def test_guarded_consumption_applies_each_order_once(rel: Reliability, broker_target: Any) -> None:
    from broker_sim.client.producer import Producer
    from broker_sim.client.push_consumer import PushConsumer
    from broker_sim.common.requests import ConsumeFromWhere

    producer = Producer(broker_target, "adapter_p")
    sender = BrokerSimSender(producer)
    stub_producer = StubProducer(rel, sender, default_group=GROUP)
    orders = ledger.make_orders("a", 60, 10, seed=2)
    with stub_producer.transaction() as tx:
        for o in orders:
            tx.stage(o.order_id, TOPIC, o.to_body())
    receipts = {r.message_id: r.receipt for r in tx.results}
    assert all(r is not None for r in receipts.values())
    assert {r.queue_id for r in receipts.values() if r is not None} == {0, 1, 2, 3}
    # the same message, sent again (a producer double-send): a second copy the guard must suppress
    sender.send(OutgoingMessage(orders[0].order_id, TOPIC, orders[0].to_body(), send_count=1))

    handler = idempotent_consumer(rel, group=GROUP)(ledger.make_business_handler("t"))
    consumer = PushConsumer(
        broker_target,
        GROUP,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_message_batch_max_size=4,
    )
    listener = GuardedListener(handler, send_back_to_dlq(consumer.transport, GROUP))
    consumer.subscribe(TOPIC, "*", listener)
    consumer.start()
    try:

        def confirmed() -> int:
            with Session(rel.engine) as s:
                return int(
                    s.scalar(select(func.count()).where(MessageStub.status == StubStatus.CONFIRMED)) or 0
                )

        wait_until(lambda: confirmed() == 60, what="60 confirmed stubs")
        wait_until(lambda: listener.stats.delivered >= 61, what="the duplicate copy")
        probe = BrokerSimProbe(consumer.transport)  # the sweeper's view: what the broker holds
        assert sum(probe.max_offset(TOPIC, q) or 0 for q in range(4)) == 61
        assert probe.max_offset("NoSuchTopic", 0) in (0, None)
    finally:
        consumer.shutdown()
        producer.shutdown()
    check = ledger.check(rel.engine, [o.order_id for o in orders], 10)
    assert check.ok, check


def started_broker(tmp_path: Path, queues: int) -> Any:
    """An in-process broker with ``TOPIC`` on ``queues`` queues and retries due after 1 s."""
    from broker_sim.broker.broker import Broker

    broker = Broker(
        str(tmp_path / "store"),
        topics={TOPIC: queues},
        message_delay_level="1s 1s 1s",
        commit_log_file_size=8 << 20,
    )
    broker.start()
    return broker


def test_retry_deliveries_move_only_the_retry_queues_watermark(rel: Reliability, tmp_path: Path) -> None:
    """Four messages, one per queue at offset 0, each failing once: the retries come back from
    %RETRY% queue 0 at offsets 0..3. Journaled under the topic they would claim the topic's queue 0 reached
    offset 3 — and the sweeper would take messages queued there for lost."""
    from broker_sim.broker.api import ConsumeFromWhere
    from broker_sim.client.producer import Producer
    from broker_sim.client.push_consumer import PushConsumer

    broker = started_broker(tmp_path, queues=4)
    producer = Producer(broker, "adapter_p3")
    sender = BrokerSimSender(producer)
    receipts = [sender.send(OutgoingMessage(f"r-{i}", TOPIC, b"{}")) for i in range(4)]
    assert sorted((r.queue_id, r.queue_offset) for r in receipts) == [(q, 0) for q in range(4)]
    failed_once: set[str] = set()

    def flaky(env: Envelope, session: Session) -> None:
        if env.message_id not in failed_once:
            failed_once.add(env.message_id or "")
            raise RuntimeError("first attempt fails")

    handler = idempotent_consumer(rel, group=GROUP)(flaky)
    consumer = PushConsumer(broker, GROUP, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    listener = GuardedListener(handler, send_back_to_dlq(consumer.transport, GROUP), batch=False)
    consumer.subscribe(TOPIC, "*", listener)
    consumer.start()
    try:
        wait_until(lambda: listener.stats.success == 4, what="4 messages applied on their retry")
    finally:
        consumer.shutdown()
        producer.shutdown()
        broker.shutdown()
    with Session(rel.engine) as s:
        marks = {(p.topic, p.queue_id): p.max_offset for p in s.scalars(select(ConsumeProgress))}
        journal = {
            (m.topic, m.original_topic, m.queue_id, m.queue_offset) for m in s.scalars(select(MessageLog))
        }
    assert marks == {**{(TOPIC, q): 0 for q in range(4)}, (RETRY, 0): 3}
    assert {(t, o) for t, o, _, _ in journal} == {(TOPIC, TOPIC), (RETRY, TOPIC)}
    assert {(q, off) for t, _, q, off in journal if t == RETRY} == {(0, k) for k in range(4)}


def test_one_retry_in_a_batch_sends_that_message_back_alone(rel: Reliability, tmp_path: Path) -> None:
    """A batch of three, the middle one failing once. Answered RECONSUME_LATER as a whole, every message of
    the batch went back to %RETRY% and came again: the two applied ones as duplicates, a dead-lettered
    one to the DLQ a second time. Only the failed message goes back; the batch is acknowledged."""
    from broker_sim.broker.api import ConsumeFromWhere
    from broker_sim.client.producer import Producer
    from broker_sim.client.push_consumer import PushConsumer

    broker = started_broker(tmp_path, queues=1)
    producer = Producer(broker, "adapter_p4")
    sender = BrokerSimSender(producer)
    for i in range(3):
        sender.send(OutgoingMessage(f"b-{i}", TOPIC, b"{}"))
    failed: list[str] = []

    def handler(env: Envelope, session: Session) -> None:
        if env.message_id == "b-1" and not failed:
            failed.append("b-1")
            raise RuntimeError("first attempt fails")

    guarded = idempotent_consumer(rel, group=GROUP)(handler)
    consumer = PushConsumer(
        broker,
        GROUP,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_message_batch_max_size=3,
    )
    listener = GuardedListener(guarded, send_back_to_dlq(consumer.transport, GROUP))
    consumer.subscribe(TOPIC, "*", listener)

    def outcomes(mid: str) -> list[str]:
        with Session(rel.engine) as s:
            rows = s.scalars(select(MessageLog).where(MessageLog.message_id == mid).order_by(MessageLog.id))
            return [str(r.outcome) for r in rows]

    consumer.start()
    try:
        wait_until(lambda: outcomes("b-1")[-1:] == ["SUCCESS"], what="b-1 applied on its retry")
        assert listener.stats.delivered == 4  # one batch of three, then b-1 alone
        assert consumer.transport.get_max_offset(RETRY, 0) == 1  # only b-1 went back
    finally:
        consumer.shutdown()
        producer.shutdown()
        broker.shutdown()
    assert [outcomes(f"b-{i}") for i in range(3)] == [["SUCCESS"], ["RETRY", "SUCCESS"], ["SUCCESS"]]


def test_dead_letter_goes_to_the_dlq_at_once(rel: Reliability, broker_target: Any) -> None:
    from broker_sim.client.producer import Producer
    from broker_sim.client.push_consumer import PushConsumer
    from broker_sim.common.message import Message
    from broker_sim.common.requests import ConsumeFromWhere

    producer = Producer(broker_target, "adapter_p2")
    producer.send(Message(TOPIC, b"not an order", keys="poison-1"))
    # one attempt allowed: the handler's failure is final at once, so the guard answers DEAD_LETTER
    strict = Reliability(engine=rel.engine, max_attempts=1)
    handler = idempotent_consumer(strict, group=GROUP)(ledger.make_business_handler("t"))
    consumer = PushConsumer(
        broker_target, GROUP, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    )
    listener = GuardedListener(handler, send_back_to_dlq(consumer.transport, GROUP))
    consumer.subscribe(TOPIC, "*", listener)
    consumer.start()
    try:
        wait_until(lambda: listener.stats.dead_lettered == 1, what="a dead-lettered message")
        dlq = f"%DLQ%{GROUP}"
        wait_until(lambda: consumer.transport.get_max_offset(dlq, 0) == 1, what="the message in the DLQ")
    finally:
        consumer.shutdown()
        producer.shutdown()
    assert listener.stats.reconsume_later == 0  # straight to the DLQ, no retry round


def test_the_brokers_last_delivery_ends_the_groups_row_dead_below_the_guards_budget(
    rel: Reliability, tmp_path: Path
) -> None:
    """The consumer's ``max_reconsume_times`` (2: three deliveries) is below the guard's ``max_attempts``
    (10). The third failure is the broker's last delivery: the group gives up there — its row ``DEAD`` with
    the guard's reason, the message in ``%DLQ%`` — instead of leaving the row ``PENDING`` for the sweeper to
    re-send as stuck, re-running the failing handler until ``max_sends``."""
    from broker_sim.broker.api import ConsumeFromWhere
    from broker_sim.client.producer import Producer
    from broker_sim.client.push_consumer import PushConsumer

    broker = started_broker(tmp_path, queues=1)
    producer = Producer(broker, "adapter_p4")
    staged = StubProducer(rel, BrokerSimSender(producer), default_group=GROUP)
    with staged.transaction() as tx:
        tx.stage("poison-2", TOPIC, b"{}")
    runs: list[int] = []

    def failing(env: Envelope, session: Session) -> None:
        runs.append(env.reconsume_times)
        raise RuntimeError("cannot handle it")

    handler = idempotent_consumer(Reliability(engine=rel.engine, max_attempts=10), group=GROUP)(failing)
    consumer = PushConsumer(
        broker, GROUP, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, max_reconsume_times=2
    )
    listener = GuardedListener(
        handler, send_back_to_dlq(consumer.transport, GROUP), batch=False, max_reconsume_times=2
    )
    consumer.subscribe(TOPIC, "*", listener)
    consumer.start()
    try:
        wait_until(lambda: listener.stats.dead_lettered == 1, what="the broker's last delivery dead-lettered")
        wait_until(lambda: consumer.transport.get_max_offset(f"%DLQ%{GROUP}", 0) == 1, what="the DLQ copy")
    finally:
        consumer.shutdown()
        producer.shutdown()
        broker.shutdown()
    assert runs == [0, 1, 2]
    with Session(rel.engine) as s:
        row = s.scalars(select(MessageInbox).where(MessageInbox.message_id == "poison-2")).one()
        reasons = [m.reason for m in s.scalars(select(MessageLog).order_by(MessageLog.id))]
    assert (row.status, row.attempts) == (StubStatus.DEAD, 10)
    assert row.last_error is not None and "the broker's last delivery" in row.last_error
    assert reasons[-1] is not None and reasons[-1].startswith("max_attempts: attempt 3/10, the broker's last")
