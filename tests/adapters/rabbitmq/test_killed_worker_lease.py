"""A worker process killed mid-handler on RabbitMQ: its delivery goes back to the queue, its Redis lease stays
for ``lease_ms``, and the message is not re-sent meanwhile.

Why: the killed worker journaled nothing (its work transaction died with it), so to the sweeper the group
has never received the message, and with no broker probe on RabbitMQ it judged the row on its age
(``TOO_OLD``) or on the group's position (``OVERTAKEN``: a later message was consumed) and re-sent it,
although the requeued copy was on the broker and the lease said it was being handled — one extra copy per
killed in-flight delivery (a burst after a crash of several workers), each a send of the group's budget.
The sweeper read the lease only of rows already received (the stuck rule). Now every resend verdict waits
for a held lease to end; the copy on the broker is then applied once by the next worker.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
import redis
from sqlalchemy import select

from reliable import Reliability, StubProducer, StubStatus
from reliable import constants as C
from reliable.adapters.rabbitmq import RabbitMQConsumer, RabbitMQSender, Topology
from reliable.models import MessageInbox, MessageLog, utcnow
from reliable.stores.lease import lease_key
from reliable.sweeper import Sweeper
from tests.adapters.rabbitmq.conftest import GROUP, TIMEOUT_S, TOPIC, effect_counts, make_handler, queue_depth

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

#: the killed worker's lease: long enough for a sweeper round to run inside it, short for the test
WORKER_LEASE_MS = 4000

HUNG_WORKER = """
import sys, threading
from sqlalchemy import text
from reliable import Reliability, idempotent_consumer
from reliable.adapters.rabbitmq import RabbitMQConsumer, Topology
db, redis_url, prefix, amqp, queue, exchange, binding, group, lease_ms = sys.argv[1:10]
rel = Reliability(db, redis_url, key_prefix=prefix, lease_ms=int(lease_ms), journal_write_behind=False)

@idempotent_consumer(rel, group=group)
def handle(env, session):
    session.execute(text("INSERT INTO rabbitmq_test_effect (message_id) VALUES (:m)"), {"m": env.message_id})
    threading.Event().wait()  # the handler never returns: the test kills the process in it

topo = Topology(queue=queue, exchange=exchange, binding_key=binding)
RabbitMQConsumer(amqp, topo, handle, prefetch=1, retry_delay_s=0).run(timeout_s=120)
"""


def wait_for(cond: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def outcomes(rel: Reliability, mid: str) -> list[str]:
    with rel.session() as s:
        return list(
            s.scalars(select(MessageLog.outcome).where(MessageLog.message_id == mid).order_by(MessageLog.id))
        )


def inbox(rel: Reliability, mid: str) -> MessageInbox:
    with rel.session() as s:
        row = s.get(MessageInbox, (GROUP, mid))
        assert row is not None
        s.expunge(row)
        return row


@pytest.mark.parametrize("verdict", ["too_old", "overtaken"])
def test_a_delivery_whose_worker_was_killed_mid_handler_is_not_resent_while_its_lease_holds(
    verdict: str,
    rel: Reliability,
    topology: Topology,
    rabbitmq_url: str,
    postgres_url: str,
    redis_url: str,
    key_prefix: str,
    admin: Any,
) -> None:
    """``too_old``: the row is past ``max_unconfirmed_age`` (the no-probe last resort); ``overtaken``: the
    group consumed a later message while the killed worker held this one. Either way a sweeper round inside
    the dead worker's lease re-sends nothing; the requeued copy is applied once after the lease, by the
    next worker, and the group's budget is untouched."""
    topology.declare(admin)
    assert topology.exchange is not None
    key = lease_key(key_prefix, GROUP, "k-1")
    leases = redis.Redis.from_url(redis_url)
    with RabbitMQSender(
        rabbitmq_url, exchange=topology.exchange, group_queue=lambda topic, group: topology.queue
    ) as sender:
        producer = StubProducer(rel, sender, default_group=GROUP)
        producer.publish("k-1", TOPIC, b"pay 1")
        if verdict == "overtaken":
            producer.publish("k-2", TOPIC, b"pay 2")
        argv = [postgres_url, redis_url, key_prefix, rabbitmq_url, topology.queue, topology.exchange, TOPIC]
        worker = subprocess.Popen([sys.executable, "-c", HUNG_WORKER, *argv, GROUP, str(WORKER_LEASE_MS)])
        try:
            # the worker's lease: its handler runs (and never returns)
            wait_for(lambda: leases.exists(key) or worker.poll() is not None, "the worker's lease")
            assert worker.poll() is None, "the worker ended before its handler ran"
            if verdict == "overtaken":  # another worker takes the next message while k-1 is in the handler
                with RabbitMQConsumer(rabbitmq_url, topology, make_handler(rel), retry_delay_s=0) as other:
                    assert other.run(until=lambda: other.counts["ack"] >= 1, timeout_s=TIMEOUT_S)
                assert effect_counts(rel) == {"k-2": 1}
        finally:
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait()
        wait_for(lambda: queue_depth(admin, topology.queue) == 1, "the dead worker's delivery to be requeued")
        assert leases.pttl(key) > 0, "the round must run inside the dead worker's lease"

        later = utcnow() + dt.timedelta(minutes=2)  # the row is due (first_resend_delay_s is a minute)
        age_s = 60 if verdict == "too_old" else C.DEFAULT_MAX_UNCONFIRMED_AGE_S
        sweeper = Sweeper(rel, sender, max_sends=3, max_unconfirmed_age_s=age_s, clock=lambda: later)
        summary = sweeper.run_once()
        assert (summary.resent, summary.lease_held) == (0, 1), summary.line()
        assert queue_depth(admin, topology.queue) == 1  # only the requeued copy
        held = inbox(rel, "k-1")
        assert held.resend_count == 0 and held.resend_at is not None and held.resend_at > later

    # the next worker finds the dead worker's lease, waits it out, then applies the copy — once
    with RabbitMQConsumer(rabbitmq_url, topology, make_handler(rel), retry_delay_s=0.05) as survivor:
        assert survivor.run(until=lambda: survivor.counts["ack"] >= 1, timeout_s=TIMEOUT_S)
    assert effect_counts(rel) == ({"k-1": 1} if verdict == "too_old" else {"k-1": 1, "k-2": 1})
    row = inbox(rel, "k-1")
    assert row.status is StubStatus.CONFIRMED and row.resend_count == 0
    seen = outcomes(rel, "k-1")
    assert seen[-1] == "SUCCESS" and "DUPLICATE" not in seen, seen
    assert queue_depth(admin, topology.queue) == 0
