"""The broker_sim adapter: envelope mapping, result mapping, and the whole path through a real broker_sim
broker (in-process and over TCP via ``broker-sim serve``) into the real guard on SQLite."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker_sim.common.message import ConsumeStatus, MessageExt, Prop
from reliable import Reliability
from reliable.adapters.broker_sim import (
    BrokerSimBacklog,
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
from reliable.models import MessageLog, MessageStub
from reliable.producer import StubProducer
from reliable.sender import OutgoingMessage
from reliable.types import ConsumeResult, Envelope, StubStatus

TOPIC = "AdapterT"
GROUP = "adapter_g"


def ext(props: dict[str, str], topic: str = TOPIC, **kw: Any) -> MessageExt:
    return MessageExt(topic=topic, body=b"x", properties=dict(props), **kw)


# --- mapping -------------------------------------------------------------------------------------------


def test_message_id_prefers_keys_then_uniq_key() -> None:
    assert message_id_of(ext({Prop.KEYS: "order-1 other", Prop.UNIQ_KEY: "U1"})) == "order-1"
    assert message_id_of(ext({Prop.UNIQ_KEY: "U1"})) == "U1"
    assert message_id_of(ext({})) is None


def test_envelope_of_a_retry_reports_the_original_topic_and_reconsume_times() -> None:
    msg = ext(
        {Prop.KEYS: "m-1", Prop.RETRY_TOPIC: TOPIC, Prop.TAGS: "A"},
        topic=f"%RETRY%{GROUP}",
        queue_id=0,
        queue_offset=7,
        reconsume_times=2,
    )
    env = to_envelope(msg)
    assert (env.message_id, env.topic, env.queue_id, env.queue_offset) == ("m-1", TOPIC, 0, 7)
    assert env.reconsume_times == 2 and env.tags == "A" and env.keys == "m-1"


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
        BrokerSimSender(Down()).send(OutgoingMessage("m", TOPIC, b"x", GROUP))


# --- through a real broker -----------------------------------------------------------------------------


def wait_for(cond: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        threading.Event().wait(0.05)


@pytest.fixture
def rel(sqlite_url: str) -> Iterator[Reliability]:
    r = Reliability(sqlite_url, None, lease_ms=2000)
    r.create_schema()
    with r.session() as s:
        s.query(MessageLog).delete()
        s.query(MessageStub).delete()
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
    sender.send(OutgoingMessage(orders[0].order_id, TOPIC, orders[0].to_body(), GROUP, send_count=1))

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

        wait_for(lambda: confirmed() == 60, what="60 confirmed stubs")
        wait_for(lambda: listener.stats.delivered >= 61, what="the duplicate copy")
    finally:
        consumer.shutdown()
        producer.shutdown()
    check = ledger.check(rel.engine, [o.order_id for o in orders], 10)
    assert check.ok, check
    backlog = BrokerSimBacklog(consumer.transport if broker_target is not None else None)  # type: ignore[arg-type]
    assert backlog is not None


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
        wait_for(lambda: listener.stats.dead_lettered == 1, what="a dead-lettered message")
        dlq = f"%DLQ%{GROUP}"
        wait_for(lambda: consumer.transport.get_max_offset(dlq, 0) == 1, what="the message in the DLQ")
    finally:
        consumer.shutdown()
        producer.shutdown()
    assert listener.stats.reconsume_later == 0  # straight to the DLQ, no retry round
