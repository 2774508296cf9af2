"""The RabbitMQ adapter's sending side and envelope mapping: publisher confirms and their failures,
reconnects, targeted resends to one group's queue, and how AMQP properties become an ``Envelope``.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import subprocess
import threading
import time
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pika.spec import Basic, BasicProperties

from broker_sim.common.net import listen_port
from reliable import ConsumeResult, Reliability, StubProducer, StubStatus
from reliable.adapters import amqp
from reliable.adapters.rabbitmq import (
    HEADER_SEQ,
    RabbitMQConsumer,
    RabbitMQSender,
    Topology,
    to_envelope,
)
from reliable.errors import ConfigurationError, SendError
from reliable.models import MessageStub
from reliable.producer import SendOutcome
from reliable.sender import OutgoingMessage
from tests.adapters.rabbitmq.conftest import GROUP, TOPIC, queue_depth

pytestmark = pytest.mark.rabbitmq


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


def test_an_unroutable_targeted_resend_names_the_group_queue_setting(rabbitmq_url: str, admin: Any) -> None:
    """The sweeper sends a group's resend to queue ``{group}`` unless told otherwise, and the guide's queue is
    ``billing.orders``: every resend came back "unroutable (no queue bound)", the setting to fix unnamed."""
    group = f"g-{uuid.uuid4().hex[:12]}"  # no queue of that name: what the default group_queue aims at
    exchange = f"rt-{uuid.uuid4().hex[:12]}.x"
    admin.exchange_declare(exchange, exchange_type="direct")
    try:
        with RabbitMQSender(rabbitmq_url, exchange=exchange) as sender:
            with pytest.raises(SendError) as targeted:
                sender.send(OutgoingMessage("u-2", TOPIC, b"x", target_group=group, send_count=1))
            with pytest.raises(SendError) as plain:
                sender.send(OutgoingMessage("u-3", TOPIC, b"x"))
    finally:
        admin.exchange_delete(exchange)
    text = str(targeted.value)
    assert "unroutable" in text and f"queue {group!r}" in text
    assert "RELIABLE_RABBITMQ_GROUP_QUEUE" in text and "group_queue" in text
    assert "RELIABLE_RABBITMQ_GROUP_QUEUE" not in str(plain.value)  # a topic send: the exchange's bindings


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
    port = listen_port()
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


@pytest.mark.parametrize("ahead_s", [-3600.0, 0.0, 60.0, 600.0, 10**9])
def test_a_sequence_far_ahead_of_the_clock_is_not_taken_as_the_position(ahead_s: float) -> None:
    """A foreign publisher's ``x-reliable-seq`` in nanoseconds (or a producer clock far ahead) raised the
    group's watermark above every real send for good: the sweeper then judged messages queued behind a
    paused group as passed, re-sent them and gave up. Up to ``AMQP_SEQ_MAX_AHEAD_S`` ahead is a clock's
    skew and kept; beyond it the delivery tag is the position."""
    seq = time.time_ns() // 1000 + int(ahead_s * 1_000_000)
    method = Basic.Deliver(delivery_tag=7, redelivered=False, exchange="ex", routing_key="rk")
    props = BasicProperties(message_id="m", headers={HEADER_SEQ: seq})
    env = to_envelope(method, props, b"body", None)
    assert env.queue_offset == (7 if ahead_s > 300 else seq)


def test_send_positions_never_repeat_in_a_process_and_follow_the_clock() -> None:
    """The position a RabbitMQ send gets (``x-reliable-seq``) stands in for an offset: strictly increasing in
    every sender of the process, and the clock's microseconds, so another process's numbers compare by
    time."""
    before = time.time_ns() // 1000
    per_thread: list[list[int]] = [[] for _ in range(4)]

    def take(out: list[int]) -> None:
        out.extend(amqp.next_seq() for _ in range(2000))

    threads = [threading.Thread(target=take, args=(out,)) for out in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = time.time_ns() // 1000
    every = [n for out in per_thread for n in out]
    assert len(set(every)) == len(every)  # never repeated
    assert all(a < b for out in per_thread for a, b in itertools.pairwise(out))
    assert before <= min(every) and max(every) <= after + len(every)


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
