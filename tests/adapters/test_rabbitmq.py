"""The RabbitMQ adapter against the real RabbitMQ server, PostgreSQL and Redis of the machine.

Every test declares its own uniquely named queue, exchanges and dead-letter queue and deletes them at the end.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pika.spec import Basic, BasicProperties
from sqlalchemy import Column, Integer, MetaData, String, Table, delete, func, select
from sqlalchemy.orm import Session

from reliable import ConsumeResult, Envelope, Reliability, StubProducer, StubStatus, idempotent_consumer
from reliable.adapters.rabbitmq import (
    HEADER_DEAD_REASON,
    HEADER_ORIGINAL_QUEUE,
    HEADER_SEQ,
    RabbitMQConsumer,
    RabbitMQSender,
    Topology,
    sweeper_sender,
    to_envelope,
)
from reliable.errors import ConfigurationError, SendError
from reliable.models import MessageInbox, MessageLog, MessageStub
from reliable.producer import SendOutcome
from reliable.sender import OutgoingMessage
from tests import services
from tests.conftest import _ensure_clean_schema

pytestmark = pytest.mark.rabbitmq

GROUP = "rmq-g"
TOPIC = "orders"
TIMEOUT_S = 20.0

effects_md = MetaData()
effects = Table(
    "rabbitmq_test_effect",
    effects_md,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(64), nullable=False),
)


# --- fixtures ---------------------------------------------------------------------------------------------


@pytest.fixture
def rel(postgres_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    _ensure_clean_schema(postgres_url)
    # journal every delivery in-line: these tests read DUPLICATE rows right after the consumer returns (the
    # default write-behind journal writes them within journal_flush_ms; tests/core/test_write_behind.py)
    r = Reliability(
        postgres_url,
        redis_url,
        key_prefix=key_prefix,
        max_attempts=3,
        lease_ms=5000,
        journal_write_behind=False,
    )
    effects_md.create_all(r.engine)
    with r.engine.begin() as conn:
        conn.execute(delete(effects))
    yield r
    r.close()


@pytest.fixture
def topology(rabbitmq_url: str) -> Iterator[Topology]:
    name = f"rt-{uuid.uuid4().hex[:12]}"
    topo = Topology(queue=name, exchange=f"{name}.x", binding_key=TOPIC)
    yield topo
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        topo.delete(conn.channel())
    finally:
        conn.close()


@pytest.fixture
def admin(rabbitmq_url: str) -> Iterator[Any]:
    """A plain channel for publishing raw messages and inspecting queues."""
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    yield conn.channel()
    conn.close()


def make_handler(rel: Reliability, fail_first: set[str] | None = None, always_fail: bool = False) -> Any:
    failed: set[str] = set()

    @idempotent_consumer(rel, group=GROUP)
    def handle(env: Envelope, session: Session) -> None:
        assert env.message_id is not None
        session.execute(effects.insert().values(message_id=env.message_id))
        if always_fail or (fail_first and env.message_id in fail_first and env.message_id not in failed):
            failed.add(env.message_id)
            raise RuntimeError(f"transient failure for {env.message_id}")

    return handle


def effect_counts(rel: Reliability) -> dict[str, int]:
    with rel.session() as s:
        rows = s.execute(select(effects.c.message_id, func.count()).group_by(effects.c.message_id)).all()
    return {mid: n for mid, n in rows}


def dlq_messages(admin: Any, topo: Topology) -> list[tuple[BasicProperties, bytes]]:
    out: list[tuple[BasicProperties, bytes]] = []
    while True:
        method, props, body = admin.basic_get(topo.dead_letter_queue, auto_ack=True)
        if method is None:
            return out
        out.append((props, body))


def queue_depth(admin: Any, queue: str) -> int:
    return int(admin.queue_declare(queue, passive=True).method.message_count)


# --- end to end ----------------------------------------------------------------------------------------


def test_publish_with_confirms_then_consume_applies_each_effect_once(
    rel: Reliability, topology: Topology, rabbitmq_url: str
) -> None:
    handle = make_handler(rel)
    with RabbitMQConsumer(rabbitmq_url, topology, handle, retry_delay_s=0) as consumer:
        with RabbitMQSender(rabbitmq_url, exchange=topology.exchange or "") as sender:
            producer = StubProducer(rel, sender, default_group=GROUP)
            results = [producer.publish(f"m-{i}", TOPIC, f"order {i}".encode()) for i in range(20)]
            # a producer double-send (lost ACK, sweeper resend) of two of them: new AMQP messages, same ids
            for mid in ("m-3", "m-7"):
                with rel.session() as s:
                    row = s.get(MessageStub, mid)
                    assert row is not None
                    sender.send(OutgoingMessage(mid, TOPIC, row.content, send_count=1))
        assert all(r.outcome is SendOutcome.SENT for r in results)
        offsets = [r.receipt.queue_offset for r in results if r.receipt is not None]
        assert offsets == sorted(offsets) and len(set(offsets)) == 20  # monotonic per process
        assert consumer.run(until=lambda: consumer.counts["ack"] >= 22, timeout_s=TIMEOUT_S)
    assert effect_counts(rel) == {f"m-{i}": 1 for i in range(20)}
    with rel.session() as s:
        assert set(s.scalars(select(MessageStub.status))) == {StubStatus.CONFIRMED}
        outcomes = s.execute(select(MessageLog.outcome, func.count()).group_by(MessageLog.outcome)).all()
    assert dict(outcomes) == {"SUCCESS": 20, "DUPLICATE": 2}


def test_nack_requeue_redelivers_and_the_effect_stays_single(
    rel: Reliability, rabbitmq_url: str, admin: Any
) -> None:
    name = f"rt-{uuid.uuid4().hex[:12]}"
    # a quorum queue counts requeues in x-delivery-count, so reconsume_times means something
    topo = Topology(queue=name, queue_type="quorum")
    handle = make_handler(rel, fail_first={"q-1", "q-2"})
    try:
        with RabbitMQConsumer(rabbitmq_url, topo, handle, retry_delay_s=0.05) as consumer:
            with RabbitMQSender(rabbitmq_url) as sender:  # default exchange: routing key = queue name
                producer = StubProducer(rel, sender, default_group=GROUP)
                for i in range(4):
                    producer.publish(f"q-{i}", name, b"x")
            assert consumer.run(until=lambda: consumer.counts["ack"] >= 4, timeout_s=TIMEOUT_S)
            assert consumer.counts["requeue"] == 2
        assert effect_counts(rel) == {f"q-{i}": 1 for i in range(4)}
        with rel.session() as s:
            log_rows = s.execute(
                select(MessageLog.message_id, MessageLog.reconsume_times, MessageLog.outcome).order_by(
                    MessageLog.id
                )
            ).all()
        retried = [(r.reconsume_times, r.outcome) for r in log_rows if r.message_id == "q-1"]
        assert retried == [(0, "RETRY"), (1, "SUCCESS")]
    finally:
        topo.delete(admin)


def test_connection_closed_before_ack_redelivers_and_the_duplicate_is_suppressed(
    rel: Reliability, topology: Topology, rabbitmq_url: str, admin: Any
) -> None:
    class Crash(BaseException):
        """The process dies after the guard committed and before the ack reached the broker."""

    handle = make_handler(rel)

    def crash_after_commit(env: Envelope) -> ConsumeResult:
        result = handle(env)
        assert result is ConsumeResult.SUCCESS
        raise Crash

    first = RabbitMQConsumer(rabbitmq_url, topology, crash_after_commit, retry_delay_s=0)
    with RabbitMQSender(rabbitmq_url, exchange=topology.exchange or "") as sender:
        StubProducer(rel, sender, default_group=GROUP).publish("c-1", TOPIC, b"pay 10")
    with pytest.raises(Crash):
        first.run(timeout_s=TIMEOUT_S)
    assert effect_counts(rel) == {"c-1": 1}
    first.close()  # the unacknowledged delivery goes back to the queue

    with RabbitMQConsumer(rabbitmq_url, topology, handle, retry_delay_s=0) as second:
        assert second.run(until=lambda: second.counts["ack"] >= 1, timeout_s=TIMEOUT_S)
    assert effect_counts(rel) == {"c-1": 1}
    with rel.session() as s:
        rows = s.execute(select(MessageLog.reconsume_times, MessageLog.outcome).order_by(MessageLog.id)).all()
    assert [(r.reconsume_times, r.outcome) for r in rows] == [(0, "SUCCESS"), (1, "DUPLICATE")]
    assert queue_depth(admin, topology.queue) == 0


CRASH_WORKER = """
import os, sys
from sqlalchemy import text
from reliable import Reliability, idempotent_consumer
from reliable.adapters.rabbitmq import RabbitMQConsumer, Topology
db, redis_url, prefix, amqp, queue, exchange, binding = sys.argv[1:8]
rel = Reliability(db, redis_url, key_prefix=prefix, max_attempts=3, lease_ms=5000)

@idempotent_consumer(rel, group="rmq-g")
def handle(env, session):
    session.execute(text("INSERT INTO rabbitmq_test_effect (message_id) VALUES (:m)"), {"m": env.message_id})

def die_after_commit(env):
    handle(env)
    os._exit(17)  # no ack, no AMQP close: the broker only sees the TCP connection drop

topo = Topology(queue=queue, exchange=exchange, binding_key=binding)
RabbitMQConsumer(amqp, topo, die_after_commit, retry_delay_s=0).run(timeout_s=60)
"""


@pytest.mark.slow
def test_consumer_process_killed_before_ack_is_redelivered_and_suppressed(
    rel: Reliability,
    topology: Topology,
    rabbitmq_url: str,
    postgres_url: str,
    redis_url: str,
    key_prefix: str,
) -> None:
    with RabbitMQSender(rabbitmq_url, exchange=topology.exchange or "") as sender:
        # declare first (the worker would too) so the publish is routable
        RabbitMQConsumer(rabbitmq_url, topology, lambda env: ConsumeResult.SUCCESS, declare=True).close()
        StubProducer(rel, sender, default_group=GROUP).publish("k-1", TOPIC, b"pay 5")
    assert topology.exchange is not None  # the fixture's topology has one; the worker binds it
    argv = [postgres_url, redis_url, key_prefix, rabbitmq_url, topology.queue, topology.exchange, TOPIC]
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_WORKER, *argv], capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 17, proc.stderr
    assert effect_counts(rel) == {"k-1": 1}
    with RabbitMQConsumer(rabbitmq_url, topology, make_handler(rel), retry_delay_s=0) as survivor:
        assert survivor.run(until=lambda: survivor.counts["ack"] >= 1, timeout_s=TIMEOUT_S)
    assert effect_counts(rel) == {"k-1": 1}
    with rel.session() as s:
        outcomes = s.scalars(select(MessageLog.outcome).order_by(MessageLog.id)).all()
    assert outcomes == ["SUCCESS", "DUPLICATE"]


@pytest.mark.slow
def test_lost_send_is_resent_by_reliable_sweep_through_rabbitmq(
    rel: Reliability, topology: Topology, rabbitmq_url: str, postgres_url: str, admin: Any
) -> None:
    """The producer crashed between its commit and its send; `reliable sweep --once` delivers the message,
    targeted: straight into the group's queue (RELIABLE_RABBITMQ_GROUP_QUEUE), not through the exchange."""
    topology.declare(admin)
    with RabbitMQSender(rabbitmq_url, exchange=topology.exchange or "") as sender:
        lazy = StubProducer(rel, sender, default_group=GROUP)
        with rel.session() as s:
            staged = lazy.stage(s, "lost-1", TOPIC, b"pay 7", send_on_commit=False)  # never sent
    assert staged.message_id == "lost-1" and queue_depth(admin, topology.queue) == 0
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RELIABLE_")},
        "RELIABLE_RABBITMQ_URL": rabbitmq_url,
        "RELIABLE_RABBITMQ_EXCHANGE": topology.exchange or "",
        "RELIABLE_RABBITMQ_GROUP_QUEUE": topology.queue,
    }
    # the stub's grace period (first_resend_delay_s) is over as far as this sweeper is concerned
    with rel.session() as s:
        inbox = s.get(MessageInbox, (GROUP, "lost-1"))
        assert inbox is not None
        inbox.resend_at = inbox.created_at - dt.timedelta(seconds=1)
    cmd = [
        str(Path(sys.executable).parent / "reliable"),
        "sweep",
        "--once",
        "--db",
        postgres_url,
        "--sender",
        "reliable.adapters.rabbitmq:sweeper_sender",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert queue_depth(admin, topology.queue) == 1
    with RabbitMQConsumer(rabbitmq_url, topology, make_handler(rel), retry_delay_s=0) as consumer:
        assert consumer.run(until=lambda: consumer.counts["ack"] >= 1, timeout_s=TIMEOUT_S)
    assert effect_counts(rel) == {"lost-1": 1}
    with rel.session() as s:
        row = s.get(MessageStub, "lost-1")
        assert row is not None and row.status is StubStatus.CONFIRMED and row.send_count == 0
        inbox = s.get(MessageInbox, (GROUP, "lost-1"))
        assert inbox is not None and inbox.status is StubStatus.CONFIRMED and inbox.resend_count == 1


def test_sweeper_sender_factory_needs_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELIABLE_RABBITMQ_URL", raising=False)
    with pytest.raises(ConfigurationError, match="RELIABLE_RABBITMQ_URL"):
        sweeper_sender(None)


def test_dead_letter_lands_in_the_dlq_with_its_reason(
    rel: Reliability, topology: Topology, rabbitmq_url: str, admin: Any
) -> None:
    handle = make_handler(rel, always_fail=True)  # max_attempts=3: two requeues, then DEAD_LETTER
    with RabbitMQConsumer(rabbitmq_url, topology, handle, retry_delay_s=0) as consumer:
        with RabbitMQSender(rabbitmq_url, exchange=topology.exchange or "") as sender:
            StubProducer(rel, sender, default_group=GROUP).publish("d-1", TOPIC, b"poison")
        assert consumer.run(until=lambda: consumer.counts["dead_letter"] >= 1, timeout_s=TIMEOUT_S)
        assert consumer.counts["requeue"] == 2 and consumer.counts["ack"] == 0
    [(props, body)] = dlq_messages(admin, topology)
    assert body == b"poison" and props.message_id == "d-1"
    assert str(props.headers[HEADER_DEAD_REASON]).startswith("max_attempts")
    assert props.headers[HEADER_ORIGINAL_QUEUE] == topology.queue
    assert queue_depth(admin, topology.queue) == 0
    assert effect_counts(rel) == {}  # every attempt rolled back


def test_message_without_id_is_dead_lettered_not_acked(
    rel: Reliability, topology: Topology, rabbitmq_url: str, admin: Any
) -> None:
    handle = make_handler(rel)
    with RabbitMQConsumer(rabbitmq_url, topology, handle, retry_delay_s=0) as consumer:
        admin.basic_publish(topology.exchange, TOPIC, b"anonymous", BasicProperties(delivery_mode=2))
        assert consumer.run(until=lambda: consumer.counts["dead_letter"] >= 1, timeout_s=TIMEOUT_S)
        assert consumer.counts["ack"] == 0
    [(props, body)] = dlq_messages(admin, topology)
    assert body == b"anonymous"
    assert str(props.headers[HEADER_DEAD_REASON]).startswith("missing_message_id")
    with rel.session() as s:
        assert s.scalar(select(MessageLog.outcome)) == "DEAD_LETTER"  # journaled, not silently dropped


def test_bare_handler_dead_letter_and_exception(
    rel: Reliability, topology: Topology, rabbitmq_url: str, admin: Any
) -> None:
    """Any ``handler(env) -> ConsumeResult`` works; one that raises is requeued, never acknowledged."""
    seen: list[Envelope] = []

    def bare(env: Envelope) -> ConsumeResult:
        seen.append(env)
        if len(seen) == 1:
            raise ValueError("bug in a bare handler")
        return ConsumeResult.DEAD_LETTER

    with RabbitMQConsumer(rabbitmq_url, topology, bare, retry_delay_s=0) as consumer:
        admin.basic_publish(topology.exchange, TOPIC, b"b", BasicProperties(message_id="b-1"))
        assert consumer.run(until=lambda: consumer.counts["dead_letter"] >= 1, timeout_s=TIMEOUT_S)
        assert consumer.counts["handler_error"] == 1
    assert [e.reconsume_times for e in seen] == [0, 1]
    [(props, _)] = dlq_messages(admin, topology)
    assert props.headers[HEADER_DEAD_REASON] == "handler answered DEAD_LETTER"


def test_stop_from_the_handler_ends_run(topology: Topology, rabbitmq_url: str, admin: Any) -> None:
    holder: list[RabbitMQConsumer] = []

    def stop_after_one(env: Envelope) -> ConsumeResult:
        holder[0].stop()
        return ConsumeResult.SUCCESS

    with RabbitMQConsumer(rabbitmq_url, topology, stop_after_one) as consumer:
        holder.append(consumer)
        admin.basic_publish(topology.exchange, TOPIC, b"s", BasicProperties(message_id="s-1"))
        admin.basic_publish(topology.exchange, TOPIC, b"s", BasicProperties(message_id="s-2"))
        assert consumer.run(timeout_s=TIMEOUT_S) is False  # returned because of stop(), not a timeout
        assert consumer.counts["ack"] >= 1


def test_dead_letter_falls_back_to_native_dead_lettering(
    rel: Reliability, rabbitmq_url: str, admin: Any
) -> None:
    """If the reasoned copy cannot be published, basic.reject still routes the message to a DLX."""
    name = f"rt-{uuid.uuid4().hex[:12]}"
    alt = Topology(queue=f"{name}-alt")
    alt.declare(admin)  # its DLX/DLQ pair serves as the queue's native dead-letter target
    native = {"x-dead-letter-exchange": alt.dead_letter_exchange, "x-dead-letter-routing-key": alt.queue}
    topo = Topology(queue=name, queue_arguments=native)
    try:
        with RabbitMQConsumer(rabbitmq_url, topo, lambda env: ConsumeResult.DEAD_LETTER) as consumer:
            admin.exchange_delete(topo.dead_letter_exchange)  # the adapter's own DLX is gone
            admin.basic_publish("", name, b"z", BasicProperties(message_id="z-1"))
            assert consumer.run(
                until=lambda: consumer.counts["dead_letter_fallback"] >= 1, timeout_s=TIMEOUT_S
            )
        method, props, body = admin.basic_get(alt.dead_letter_queue, auto_ack=True)
        assert method is not None and body == b"z"
        assert props.headers["x-death"][0]["reason"] == "rejected"
    finally:
        topo.delete(admin)
        alt.delete(admin)


# --- sender --------------------------------------------------------------------------------------------


def test_unroutable_send_is_a_send_error_and_the_stub_stays_pending(
    rel: Reliability, rabbitmq_url: str, admin: Any
) -> None:
    exchange = f"rt-{uuid.uuid4().hex[:12]}.x"
    admin.exchange_declare(exchange, exchange_type="direct")
    try:
        with RabbitMQSender(rabbitmq_url, exchange=exchange) as sender:
            with pytest.raises(SendError, match="unroutable"):
                sender.send(OutgoingMessage("u-0", TOPIC, b"x"))
            result = StubProducer(rel, sender, default_group=GROUP).publish("u-1", TOPIC, b"x")
        assert result.outcome is SendOutcome.FAILED
        with rel.session() as s:
            row = s.get(MessageStub, "u-1")
            assert row is not None
            assert row.status is StubStatus.PENDING and row.queue_offset is None
            assert row.last_error is not None and "unroutable" in row.last_error
    finally:
        admin.exchange_delete(exchange)


def _close_connection_on_the_server(name: str) -> None:
    """Close one named connection from the broker side (what a heartbeat timeout or a broker restart does)."""
    deadline = time.monotonic() + 30
    while True:
        listing = subprocess.run(
            ["rabbitmqctl", "-q", "list_connections", "pid", "client_properties"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        pids = [line.split("\t", 1)[0] for line in listing.stdout.splitlines() if name in line]
        if pids:
            break
        assert time.monotonic() < deadline, f"connection {name} not listed: {listing.stdout}{listing.stderr}"
    for pid in pids:
        cmd = ["rabbitmqctl", "close_connection", pid, "test"]
        subprocess.run(cmd, capture_output=True, timeout=60, check=True)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("rabbitmqctl") is None, reason="needs rabbitmqctl on this machine")
def test_sender_reconnects_after_the_broker_closed_its_idle_connection(
    topology: Topology, rabbitmq_url: str, admin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reliable.adapters.rabbitmq")
    topology.declare(admin)
    name = f"reliable-test-{uuid.uuid4().hex[:8]}"
    with RabbitMQSender(rabbitmq_url, exchange=topology.exchange or "", connection_name=name) as sender:
        first = sender.send(OutgoingMessage("r-1", TOPIC, b"1"))
        _close_connection_on_the_server(name)
        second = sender.send(OutgoingMessage("r-2", TOPIC, b"2"))  # noticed, reconnected, sent
    assert "reconnecting once" in caplog.text  # the stale connection was really hit, then replaced
    assert second.queue_offset > first.queue_offset
    assert queue_depth(admin, topology.queue) == 2


def test_sender_reports_unreachable_broker_and_bad_url() -> None:
    port = services.free_port()
    sender = RabbitMQSender(f"amqp://guest:guest@127.0.0.1:{port}/%2F?connection_attempts=1&socket_timeout=1")
    with pytest.raises(SendError):
        sender.send(OutgoingMessage("x", TOPIC, b"x"))
    bad = "amqp://guest:guest@127.0.0.1:5672/%2F?heartbeat=notanumber"
    with pytest.raises(ConfigurationError, match="bad AMQP URL"):
        RabbitMQSender(bad)
    with pytest.raises(ConfigurationError, match="bad AMQP URL"):
        RabbitMQConsumer(bad, "q", lambda env: ConsumeResult.SUCCESS)
    with pytest.raises(ConfigurationError, match="prefetch"):
        RabbitMQConsumer(
            "amqp://guest:guest@127.0.0.1:5672/%2F", "q", lambda env: ConsumeResult.SUCCESS, prefetch=0
        )


# --- envelope mapping (no broker) ----------------------------------------------------------------------


@given(
    prop_id=st.one_of(st.none(), st.text(min_size=1, max_size=10)),
    header_id=st.one_of(st.none(), st.text(min_size=1, max_size=10)),
    delivery_count=st.one_of(st.none(), st.integers(min_value=0, max_value=50)),
    redelivered=st.booleans(),
    seq=st.one_of(st.none(), st.integers(min_value=1, max_value=2**40)),
    tag=st.integers(min_value=1, max_value=2**31),
)
def test_envelope_mapping(
    prop_id: str | None,
    header_id: str | None,
    delivery_count: int | None,
    redelivered: bool,
    seq: int | None,
    tag: int,
) -> None:
    headers: dict[str, Any] = {}
    if header_id is not None:
        headers["message-id"] = header_id
    if delivery_count is not None:
        headers["x-delivery-count"] = delivery_count
    if seq is not None:
        headers[HEADER_SEQ] = seq
    method = Basic.Deliver(delivery_tag=tag, redelivered=redelivered, exchange="ex", routing_key="rk")
    env = to_envelope(method, BasicProperties(message_id=prop_id, headers=headers), b"body", None)
    assert env.message_id == (prop_id or header_id)
    assert env.topic == "rk" and env.queue_id == 0 and env.body == b"body"
    expected_times = delivery_count if delivery_count is not None else int(redelivered)
    assert env.reconsume_times == expected_times
    assert env.queue_offset == (seq if seq is not None else tag)
    assert env.properties["amqp.redelivered"] == str(redelivered).lower()


def test_targeted_resend_reaches_only_that_groups_queue(rabbitmq_url: str, admin: Any) -> None:
    """Fan-out: two groups' queues bound to one exchange; the sweeper's resend for one group goes to its queue
    alone (the other group is not handed a duplicate), a topic send still reaches both."""
    name = f"rt-{uuid.uuid4().hex[:12]}"
    queues = {"billing": Topology(f"{name}.billing", f"{name}.x", TOPIC), "audit": Topology(f"{name}.audit")}
    queues["billing"].declare(admin)
    queues["audit"].declare(admin)
    admin.queue_bind(queues["audit"].queue, f"{name}.x", routing_key=TOPIC)
    try:
        with RabbitMQSender(
            rabbitmq_url, exchange=f"{name}.x", group_queue=lambda topic, group: queues[group].queue
        ) as sender:
            sender.send(OutgoingMessage("t-1", TOPIC, b"x", target_group="audit"))
            assert [queue_depth(admin, q.queue) for q in queues.values()] == [0, 1]
            sender.send(OutgoingMessage("t-2", TOPIC, b"x"))
            assert [queue_depth(admin, q.queue) for q in queues.values()] == [1, 2]
    finally:
        for topo in queues.values():
            topo.delete(admin)
