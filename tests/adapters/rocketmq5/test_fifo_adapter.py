"""``reliable.adapters.rocketmq5`` on FIFO consumer groups, with the official 5.x client and broker_sim.

A FIFO group changes what the client does with a failure: the PushConsumer retries a message *locally*
(the same delivery, ``delivery_attempt`` unchanged) and forwards it to the DLQ itself after the policy's
last local try, and a message group's next message waits for it. Each test here is a way that went wrong:
a refused message (a second body under a known id) jammed its message group and the worker's shutdown; a
poison message went to the DLQ with the guard's row left PENDING and nobody told; and the SimpleConsumer
loop applied a message group's later messages before the earlier one that had failed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from broker_sim.grpc.policy import GroupPolicy
from tests.adapters.rocketmq5.conftest import TOPIC, GrpcBroker, GrpcBrokerFactory
from tests.adapters.rocketmq5.test_adapter import (
    Worker,
    applied,
    inbox_status,
    journal,
    start,
)
from tests.adapters.rocketmq5.test_adapter import db as db  # the fixture
from tests.adapters.rocketmq5.test_adapter import workers as workers  # the fixture
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(240)]
#: local FIFO retries of the push client sleep the policy's backoff in real time: keep it short
FIFO_POLICY = GroupPolicy(fifo=True, max_attempts=3, backoff_s=(0.2,))


@pytest.fixture
def ordered_db(db: str) -> Iterator[str]:
    """``applied5`` with the order of the applications (a sequence filled in by the handler's insert)."""
    engine = create_engine(db)
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE applied5 ADD COLUMN IF NOT EXISTS seq bigserial"))
    engine.dispose()
    yield db


def send_fifo(broker: GrpcBroker, message_group: str, *messages: tuple[str, str]) -> None:
    """Send ``(key, body)`` pairs in order, all in one FIFO message group (so on one queue)."""
    producer = broker.client()
    producer.call("producer", topics=[TOPIC])
    for key, body in messages:
        producer.call("send", topic=TOPIC, body=body, keys=key, group=message_group)


def dlq_count(broker: GrpcBroker, group: str) -> int:
    b = broker.server.broker
    assert b is not None
    return b.get_max_offset(f"%DLQ%{group}", 0)


def reasons(db: str, key: str, group: str) -> list[str | None]:
    engine = create_engine(db)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT reason FROM message_log WHERE message_id = :m AND consumer_group = :g ORDER BY id"),
            {"m": key, "g": group},
        ).all()
    engine.dispose()
    return [r[0] for r in rows]


def stops_promptly(worker: Worker, within_s: float = 15.0) -> float:
    """SIGTERM the worker; how long it took to exit (fails if it did not within ``within_s``)."""
    began = time.monotonic()
    worker.proc.terminate()
    wait_until(lambda: worker.proc.poll() is not None, timeout=within_s, what="the worker to exit on SIGTERM")
    return time.monotonic() - began


def test_a_refused_message_leaves_its_fifo_message_group_and_the_next_one_is_applied(
    make_broker: GrpcBrokerFactory, db: str, workers: list[Worker], tmp_path: Path
) -> None:
    """The guard refuses a second body under a known id (DEAD_LETTER, payload mismatch). The listener
    forwarded it to the DLQ and answered FAILURE; the FIFO client then ran it again locally (a DEAD_LETTER
    journal row each time, a forward refused for the stale handle) and then tried to dead-letter the stale
    handle itself in an endless loop: the message group's next message was never applied and SIGTERM could
    not stop the worker. Now the forwarded message counts as consumed: one DLQ copy, one journal row, the next
    message of the group applied, a prompt shutdown."""
    tag = uuid.uuid4().hex[:6]
    group, key, after, control = f"fifob{tag}", f"B1-{tag}", f"B2-{tag}", tmp_path / "c"
    broker = make_broker(groups={group: FIFO_POLICY})
    worker = start(broker, db, workers, control, group=group, mode="push")
    send_fifo(broker, "G1", (key, "first"), (key, "tampered"), (after, "after"))
    wait_until(lambda: applied(db, after), what="the next message of the message group")
    wait_until(lambda: dlq_count(broker, group) == 1, what="the DLQ copy")
    assert [o for _, o in journal(db, key, group)] == ["SUCCESS", "DEAD_LETTER"]
    assert "payload" in (reasons(db, key, group)[-1] or "")
    stops_promptly(worker)
    assert dlq_count(broker, group) == 1
    assert len(applied(db, key)) == 1 and len(applied(db, after)) == 1


def test_a_poison_message_in_a_fifo_group_ends_dead_and_its_message_group_goes_on(
    make_broker: GrpcBrokerFactory, db: str, workers: list[Worker], tmp_path: Path
) -> None:
    """A FIFO push client retries a failing message locally — the same delivery, ``delivery_attempt`` still
    1 — and forwards it to the DLQ after the policy's third try. The guard was never told a try was the
    last: the DLQ got the message while its row stayed PENDING with no reason and nobody told, the journal
    only RETRY rows. The listener counts the local tries now: the third is the guard's last attempt."""
    tag = uuid.uuid4().hex[:6]
    group, key, after, control = f"fifop{tag}", f"P1-{tag}", f"P2-{tag}", tmp_path / "c"
    broker = make_broker(groups={group: FIFO_POLICY})
    worker = start(broker, db, workers, control, group=group, mode="push")
    send_fifo(broker, "G1", (key, "poison"), (after, "after"))
    wait_until(lambda: applied(db, after), what="the next message of the message group")
    wait_until(lambda: len(journal(db, key, group)) >= 3, what="three journal rows")
    assert journal(db, key, group) == [(0, "RETRY"), (1, "RETRY"), (2, "DEAD_LETTER")]
    wait_until(lambda: inbox_status(db, key, group) == "DEAD", what="the row DEAD")
    assert "poison" in (reasons(db, key, group)[-1] or "")
    stops_promptly(worker)
    assert dlq_count(broker, group) == 1
    assert applied(db, key) == [] and len(applied(db, after)) == 1


def applied_in_order(db: str, group: str) -> list[str]:
    engine = create_engine(db)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT message_id FROM applied5 WHERE group_name = :g ORDER BY seq"), {"g": group}
        ).all()
    engine.dispose()
    return [r[0] for r in rows]


@pytest.mark.parametrize("one_per_message_group", [True, False], ids=["one-per-group", "runs"])
def test_a_fifo_message_group_keeps_its_order_when_a_message_is_retried(
    make_broker: GrpcBrokerFactory, ordered_db: str, workers: list[Worker], tmp_path: Path,
    one_per_message_group: bool,
) -> None:  # fmt: skip
    """S-1, S-2, S-3 in one message group; S-1 fails once. One receive carried all three, and the
    SimpleConsumer loop went on with S-2 and S-3 while S-1 waited for its retry: applied S-2, S-3, S-1. Now
    broker_sim hands out one message of a message group per receive, and the loop gives a batch's later
    messages of a group back behind its retried one — the case of a broker that hands out a run of the group
    (as an Apache broker's orderly pop does): applied S-1, S-2, S-3 either way."""
    from reliable.adapters.rocketmq5 import retry_delay_s

    tag = uuid.uuid4().hex[:6]
    group, control = f"fifos{tag}", tmp_path / "c"
    keys = [f"S{i}-{tag}" for i in (1, 2, 3)]
    broker = make_broker(groups={group: GroupPolicy(fifo=True)})
    assert broker.server.grpc is not None
    pop = broker.server.grpc.pop
    pop.fifo_one_per_message_group = one_per_message_group
    send_fifo(broker, "G1", (keys[0], "flaky"), (keys[1], "two"), (keys[2], "three"))
    start(broker, ordered_db, workers, control, group=group, invisible_s=30, extend_every_s=0.2)
    wait_until(lambda: journal(ordered_db, keys[0], group), what="the first attempt at S-1")
    backoff_ms = retry_delay_s(1) * 1000

    def all_waiting_for_the_retry() -> bool:  # received and extended: 30 s; given back: the backoff
        handles = pop.inflight(group, TOPIC).values()
        return bool(handles) and all(h.invisible_ms == backoff_ms for h in handles)

    wait_until(all_waiting_for_the_retry, what="the message group waiting for S-1's retry")
    broker.advance(backoff_ms / 1000 + 1)
    wait_until(lambda: len(applied_in_order(ordered_db, group)) == 3, what="all three applied")
    assert applied_in_order(ordered_db, group) == keys
