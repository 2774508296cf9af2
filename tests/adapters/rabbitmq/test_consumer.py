"""The RabbitMQ adapter's consuming side against the machine's real RabbitMQ server, PostgreSQL and Redis:
exactly-once effects under redelivery, dead-lettering with a reason, and a lost send re-sent by the sweeper.

Every test declares its own uniquely named queue, exchanges and dead-letter queue and deletes them at the end
(``conftest.py``).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from pika.spec import BasicProperties
from sqlalchemy import func, select

from reliable import ConsumeResult, Envelope, Reliability, StubProducer, StubStatus
from reliable.adapters.rabbitmq import (
    HEADER_DEAD_REASON,
    HEADER_ORIGINAL_QUEUE,
    RabbitMQConsumer,
    RabbitMQSender,
    Topology,
    sweeper_sender,
)
from reliable.errors import ConfigurationError
from reliable.models import MessageInbox, MessageLog, MessageStub, utcnow
from reliable.producer import SendOutcome
from reliable.sender import OutgoingMessage
from reliable.sweeper import FixedBackoff, Sweeper
from tests.adapters.rabbitmq.conftest import (
    GROUP,
    TIMEOUT_S,
    TOPIC,
    dlq_messages,
    effect_counts,
    make_handler,
    queue_depth,
)

pytestmark = pytest.mark.rabbitmq


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


SECOND_PRODUCER = """
import sys
from reliable import Reliability, StubProducer
from reliable.adapters.rabbitmq import RabbitMQSender
db_url, mq_url, exchange, topic, group, message_id = sys.argv[1:7]
rel = Reliability(db_url, redis_url="")
with RabbitMQSender(mq_url, exchange=exchange) as sender:
    StubProducer(rel, sender, default_group=group).publish(message_id, topic, b"from another producer")
rel.close()
"""


def test_a_message_from_another_producer_process_waits_for_a_paused_group_instead_of_being_resent(
    rel: Reliability, topology: Topology, rabbitmq_url: str, postgres_url: str, admin: Any
) -> None:
    """Two producer processes on one queue (replicas, or one restarted); the group consumed the first one's
    messages and then stops — a deploy, a slow handler — while the second publishes. Its message is queued,
    not lost: sweep after sweep must hold it, not re-send it until the budget is spent and a person is told
    about a message that was never missing (per-process counters made it compare as "already passed")."""
    topology.declare(admin)
    with RabbitMQSender(rabbitmq_url, exchange=topology.exchange or "") as sender:
        producer = StubProducer(rel, sender, default_group=GROUP)
        for i in range(5):
            producer.publish(f"p1-{i}", TOPIC, b"from the first producer")
    with RabbitMQConsumer(rabbitmq_url, topology, make_handler(rel), retry_delay_s=0) as consumer:
        assert consumer.run(until=lambda: consumer.counts["ack"] >= 5, timeout_s=TIMEOUT_S)
    argv = [postgres_url, rabbitmq_url, topology.exchange or "", TOPIC, GROUP, "p2-0"]
    proc = subprocess.run(
        [sys.executable, "-c", SECOND_PRODUCER, *argv], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert queue_depth(admin, topology.queue) == 1

    later = utcnow()
    resend_to = RabbitMQSender(
        rabbitmq_url, exchange=topology.exchange or "", group_queue=lambda t, g: topology.queue
    )
    with resend_to:
        sweeper = Sweeper(rel, resend_to, backoff=FixedBackoff((60.0,)), max_sends=3, clock=lambda: later)
        for _ in range(10):  # ten rounds over twenty minutes of a paused group
            later += dt.timedelta(minutes=2)
            summary = sweeper.run_once()
            assert (summary.resent, summary.dead) == (0, 0), summary.line()
    assert queue_depth(admin, topology.queue) == 1  # the one copy, still waiting for the group
    with RabbitMQConsumer(rabbitmq_url, topology, make_handler(rel), retry_delay_s=0) as consumer:
        assert consumer.run(until=lambda: consumer.counts["ack"] >= 1, timeout_s=TIMEOUT_S)
    assert effect_counts(rel) == {**{f"p1-{i}": 1 for i in range(5)}, "p2-0": 1}
    with rel.session() as s:
        assert (
            s.scalar(select(MessageStub.status).where(MessageStub.message_id == "p2-0"))
            is StubStatus.CONFIRMED
        )


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


def test_ids_that_differ_only_in_bytes_that_are_not_utf8_are_dead_lettered_not_merged(
    rel: Reliability, topology: Topology, rabbitmq_url: str, admin: Any
) -> None:
    """Two messages whose ``message-id`` headers differ in a byte that is not UTF-8. Decoded with
    replacement characters they were one id: the second was acknowledged as the first's duplicate, its
    handler never run. Neither id can be stored as it is: both go to the DLQ with the reason."""
    handle = make_handler(rel)
    with RabbitMQConsumer(rabbitmq_url, topology, handle, retry_delay_s=0) as consumer:
        for raw in (b"hX\xff", b"hX\xfe"):
            props = BasicProperties(delivery_mode=2, headers={"message-id": raw})
            admin.basic_publish(topology.exchange, TOPIC, b"same body", props)
        assert consumer.run(until=lambda: consumer.counts["dead_letter"] >= 2, timeout_s=TIMEOUT_S)
        assert consumer.counts["ack"] == 0
    dead = dlq_messages(admin, topology)
    assert len(dead) == 2 and all(b == b"same body" for _, b in dead)
    assert all("not valid Unicode" in str(p.headers[HEADER_DEAD_REASON]) for p, _ in dead)
    assert effect_counts(rel) == {}


def test_an_id_property_that_is_not_utf8_is_dead_lettered_not_requeued_for_ever(
    rel: Reliability, topology: Topology, rabbitmq_url: str, admin: Any
) -> None:
    """pika hands a ``message_id`` property that is not UTF-8 over as bytes; the guard raised on it, and the
    delivery was requeued as a handler error, round after round, never journaled nor dead-lettered."""
    handle = make_handler(rel)
    with RabbitMQConsumer(rabbitmq_url, topology, handle, retry_delay_s=0) as consumer:
        props = BasicProperties(message_id=b"id\xff\xfe", delivery_mode=2)
        admin.basic_publish(topology.exchange, TOPIC, b"odd id", props)
        admin.basic_publish(topology.exchange, TOPIC, b"good", BasicProperties(message_id="g-1"))
        assert consumer.run(
            until=lambda: (
                consumer.counts["dead_letter"] + consumer.counts["handler_error"] >= 1
                and consumer.counts["ack"] >= 1
            ),
            timeout_s=TIMEOUT_S,
        )
        assert consumer.counts["handler_error"] == 0 and consumer.counts["requeue"] == 0
    [(props, body)] = dlq_messages(admin, topology)
    assert body == b"odd id" and "not valid Unicode" in str(props.headers[HEADER_DEAD_REASON])
    assert effect_counts(rel) == {"g-1": 1}


def test_declare_false_on_a_queue_without_a_dead_letter_exchange_keeps_what_it_cannot_dead_letter(
    rel: Reliability, rabbitmq_url: str, admin: Any
) -> None:
    """``declare=False``: the queue is the operators', declared without a dead-letter exchange, and the
    reasoned copy cannot be published (an exchange of another type holds the dead-letter exchange's name).
    Rejecting — the fallback for a queue the consumer declared with its own dead-lettering — dropped the
    message with one log line; it stays in the queue instead."""
    name = f"rt-{uuid.uuid4().hex[:12]}"
    topo = Topology(queue=name)
    admin.queue_declare(name, durable=True)  # no x-dead-letter-exchange
    admin.exchange_declare(topo.dead_letter_exchange, exchange_type="fanout")
    try:
        dead = lambda env: ConsumeResult.DEAD_LETTER  # noqa: E731
        with RabbitMQConsumer(rabbitmq_url, topo, dead, retry_delay_s=0, declare=False) as consumer:
            admin.basic_publish("", name, b"keep me", BasicProperties(message_id="k-1", delivery_mode=2))
            assert consumer.run(
                until=lambda: consumer.counts["dead_letter_fallback"] >= 2, timeout_s=TIMEOUT_S
            )
        assert queue_depth(admin, name) == 1  # back in the queue once the consumer closed
    finally:
        topo.delete(admin)


def test_a_foreign_delivery_count_header_does_not_stop_the_consumer(
    rel: Reliability, topology: Topology, rabbitmq_url: str, admin: Any
) -> None:
    """Any publisher can put ``x-delivery-count`` on a classic queue's message, with any value: the consumer
    goes on, processes it and the message behind it, once each."""
    handle = make_handler(rel)
    with RabbitMQConsumer(rabbitmq_url, topology, handle, retry_delay_s=0) as consumer:
        for message_id, count in [
            ("m-text", "abc"),
            ("m-list", [1, 2]),
            ("m-negative", -3),
            (
                "m-huge",
                2**31,
            ),  # wider than the journal's column: clamped, not "database unavailable" for ever
            ("m-good", None),
        ]:
            headers = {"x-delivery-count": count} if count is not None else {}
            props = BasicProperties(message_id=message_id, delivery_mode=2, headers=headers)
            admin.basic_publish(topology.exchange, TOPIC, f"body-{message_id}".encode(), props)
        assert consumer.run(until=lambda: consumer.counts["ack"] >= 5, timeout_s=TIMEOUT_S)
    assert effect_counts(rel) == {"m-text": 1, "m-list": 1, "m-negative": 1, "m-huge": 1, "m-good": 1}
    assert queue_depth(admin, topology.queue) == 0 and dlq_messages(admin, topology) == []


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


def test_a_deleted_dead_letter_queue_is_declared_again_and_keeps_the_message(
    rel: Reliability, topology: Topology, rabbitmq_url: str, admin: Any
) -> None:
    """Someone deleted the DLQ: the reasoned copy is unroutable, and the queue's own dead-lettering goes to
    the same exchange, so rejecting would drop the message. The consumer declares the dead-letter path again
    and the copy lands there with its reason."""
    with RabbitMQConsumer(rabbitmq_url, topology, lambda env: ConsumeResult.DEAD_LETTER) as consumer:
        admin.queue_delete(topology.dead_letter_queue)
        admin.basic_publish(topology.exchange, TOPIC, b"poison", BasicProperties(message_id="p-1"))
        assert consumer.run(until=lambda: consumer.counts["dead_letter"] >= 1, timeout_s=TIMEOUT_S)
        assert consumer.counts["dead_letter_fallback"] == 0
    [(props, body)] = dlq_messages(admin, topology)
    assert body == b"poison" and props.headers[HEADER_DEAD_REASON] == "handler answered DEAD_LETTER"
    assert queue_depth(admin, topology.queue) == 0


def test_dead_letter_falls_back_to_native_dead_lettering(
    rel: Reliability, rabbitmq_url: str, admin: Any
) -> None:
    """If the reasoned copy cannot be published even after declaring the dead-letter path again, basic.reject
    still routes the message to the queue's own DLX."""
    name = f"rt-{uuid.uuid4().hex[:12]}"
    alt = Topology(queue=f"{name}-alt")
    alt.declare(admin)  # its DLX/DLQ pair serves as the queue's native dead-letter target
    native = {"x-dead-letter-exchange": alt.dead_letter_exchange, "x-dead-letter-routing-key": alt.queue}
    topo = Topology(queue=name, queue_arguments=native)
    try:
        with RabbitMQConsumer(rabbitmq_url, topo, lambda env: ConsumeResult.DEAD_LETTER) as consumer:
            # the adapter's own DLX is gone, and an exchange of another type took its name: it cannot be
            # declared again, and nothing is bound to it
            admin.exchange_delete(topo.dead_letter_exchange)
            admin.exchange_declare(topo.dead_letter_exchange, exchange_type="fanout")
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
