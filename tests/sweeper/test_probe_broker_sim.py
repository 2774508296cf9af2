"""The loss probe against a real broker_sim broker: a power cut loses unflushed messages on a quiet queue.

No consumer traffic will ever overtake such a message, and its group may never have consumed that queue at
all, so the group's watermark cannot prove the loss — the broker's own max offset does. These tests lose
messages for real (``faults.crash_broker`` before a flush), record the producer's receipts the way the
producer does, and let the sweeper ask the restarted broker.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from broker_sim.broker.broker import Broker
from broker_sim.client.message import Message, MessageQueue
from broker_sim.client.producer import Producer
from reliable import Reliability
from reliable.adapters.broker_sim import BrokerSimSender, to_message
from reliable.models import StubNotification
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.sweeper import FixedBackoff, Sweeper, metrics
from reliable.sweeper.notices import QueueRef, never_consumed_marker
from reliable.types import StubStatus
from tests.sweeper.helpers import (
    T0,
    TOLD,
    Clock,
    MemoryChannel,
    add_log,
    add_stub,
    get_inbox,
    set_inbox,
    set_progress,
)

TOPIC = "ProbeT"
CONFIG: dict[str, Any] = {
    # the groups' retry topics exist as their consumers' heartbeats left them (routes of %RETRY% topics
    # come from the broker that hosts them)
    "topics": {TOPIC: 2, "%RETRY%billing": 1, "%RETRY%audit": 1},
    "commit_log_file_size": 8 << 20,
    "flush_interval_commit_log_ms": 3_600_000,  # nothing is flushed before the crash
}
BACKOFF = FixedBackoff((10.0,))


@pytest.fixture
def rel(sqlite_url: str) -> Iterator[Reliability]:
    """SQLite: the broker is the subject here; the statements run on every backend in test_selection/round."""
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    r = Reliability(sqlite_url, redis_url="", max_sends=3, stuck_after_s=600)
    yield r
    r.close()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


def start(store: Path) -> Broker:
    broker = Broker(str(store), **CONFIG)
    broker.start()
    return broker


def send(broker: Broker, ids: Sequence[str], queue_id: int | None = None) -> dict[str, SendReceipt]:
    """Send each id (to ``queue_id`` when given) and return the receipts the producer would record."""
    producer = Producer(broker, "probe_p")
    producer.start()

    def to_queue(mqs: Sequence[MessageQueue], _msg: Message, _arg: Any) -> MessageQueue:
        return next(mq for mq in mqs if mq.queue_id == queue_id)

    try:
        out = {}
        for m in ids:
            r = producer.send(
                to_message(OutgoingMessage(m, TOPIC, m.encode())), to_queue if queue_id is not None else None
            )
            out[m] = SendReceipt(int(r.queue_id), int(r.queue_offset))
        return out
    finally:
        producer.shutdown()


def stage(rel: Reliability, receipts: dict[str, SendReceipt], groups: Sequence[str] = ("billing",)) -> None:
    """What the producer records after its send: the stub with the receipt, one PENDING row per group."""
    for m, r in receipts.items():
        add_stub(rel, m, groups=groups, topic=TOPIC, queue_id=r.queue_id, queue_offset=r.queue_offset)


@pytest.fixture
def crashed(rel: Reliability, store: Path) -> Iterator[tuple[Broker, dict[str, SendReceipt]]]:
    """One message sent and lost in a power cut; the restarted broker has an empty topic."""
    first = start(store)
    send(first, ["kept-0", "kept-1"], queue_id=0)
    first.store.flush()  # these two survive the power cut …
    lost = send(first, ["lost-1"], queue_id=0)  # … this one, on the same queue, does not
    first.faults.crash_broker(first)
    broker = start(store)
    try:
        yield broker, lost
    finally:
        broker.shutdown()


def sweeper(rel: Reliability, broker: Broker, clock: Clock, **kw: Any) -> tuple[Sweeper, Producer]:
    producer = Producer(broker, "probe_sweeper")
    producer.start()
    return Sweeper(rel, BrokerSimSender(producer), backoff=BACKOFF, clock=clock, **kw), producer


def test_loss_on_a_quiet_queue_is_found_by_the_probe_and_resent_once(
    rel: Reliability, crashed: tuple[Broker, dict[str, SendReceipt]], clock: Clock
) -> None:
    broker, lost = crashed
    assert lost["lost-1"] == SendReceipt(0, 2)
    assert broker.get_max_offset(TOPIC, 0) == 2  # the broker really lost it, and queue 0 stays quiet
    # on the busy queue: messages the group has not reached yet (merely queued) …
    queued = send(broker, ["fill-0", "fill-1", "queued-1"], queue_id=1)
    stage(rel, lost | {"queued-1": queued["queued-1"]})
    set_progress(rel, 0, topic=TOPIC, queue_id=1)  # … the group is at offset 0 there, queued-1 is at 2
    # on queue 0 the group read kept-0 and kept-1 long ago: its watermark (1) is below the lost offset (2),
    # and no later message will ever pass it
    set_progress(rel, 1, topic=TOPIC, queue_id=0)

    sw, producer = sweeper(rel, broker, clock)
    try:
        summary = sw.run_once()
        assert (summary.resent, summary.held) == (1, 1)
        # the resend went to the group's retry topic only, carrying the original topic
        assert broker.get_max_offset("%RETRY%billing", 0) == 1
        row = get_inbox(rel, "lost-1")
        assert (row.resend_count, row.queue_id, row.queue_offset) == (1, 0, 0)
        assert get_inbox(rel, "queued-1").resend_count == 0
        # later rounds: the copy is there (probe), waiting for the group → no second resend, ever
        for _ in range(3):
            clock.advance(3600)
            assert sw.run_once().resent == 0
        assert broker.get_max_offset("%RETRY%billing", 0) == 1
    finally:
        producer.shutdown()


def test_a_group_that_never_consumed_the_queue_raises_one_alarm_not_a_resend_storm(
    rel: Reliability, store: Path, clock: Clock
) -> None:
    broker = start(store)
    try:
        receipts = send(broker, [f"wait-{i}" for i in range(4)])
        stage(rel, receipts, groups=("audit",))  # audit has no consume_progress row anywhere
        label = {"group": "audit", "topic": TOPIC, "broker_name": ""}  # a stub of before broker names
        before = {q: _never_consumed(label, q) for q in (0, 1)}
        channel = MemoryChannel()
        sw, producer = sweeper(rel, broker, clock, channels=[channel])
        try:
            for _ in range(3):
                summary = sw.run_once()
                assert summary.resent == 0
                clock.advance(3600)
        finally:
            producer.shutdown()
        assert sum(_never_consumed(label, q) - before[q] for q in (0, 1)) == 4 * 3  # every row, every round
        # one notice per queue and channel, raised in the first round only
        assert sorted(n.reason.split(":")[0] for n in channel.notices) == [
            f"NEVER_CONSUMED topic={TOPIC} queue=0",
            f"NEVER_CONSUMED topic={TOPIC} queue=1",
        ]
        with rel.engine.connect() as conn:
            rows = conn.execute(
                select(
                    StubNotification.channel, StubNotification.consumer_group, StubNotification.message_id
                ).where(TOLD)
            ).all()
        # per queue: the alarm on its own key (log, and memory: owed there, delivered), none on a message's
        markers = sorted(never_consumed_marker(QueueRef(TOPIC, q)) for q in (0, 1))
        assert sorted((m, c, g) for c, g, m in rows) == [
            (m, c, "audit") for m in markers for c in ("log", "memory")
        ]
        assert all(get_inbox(rel, m, "audit").status is StubStatus.PENDING for m in receipts)
        assert broker.get_max_offset("%RETRY%audit", 0) in (0, None)
        assert "CONSUME_FROM_LAST_OFFSET" in channel.notices[0].reason  # the other cause, said
        # not held for ever: a group that started from the queue's end (subscribed, never given these by the
        # broker) reads a resend — once the copies are older than max_unconfirmed_age, each is sent to it once
        clock.advance(sw.max_unconfirmed_age.total_seconds())
        sw2, producer = sweeper(rel, broker, clock, channels=[channel])
        try:
            assert sw2.run_once().resent == len(receipts)
            assert sw2.run_once().resent == 0
        finally:
            producer.shutdown()
        assert broker.get_max_offset("%RETRY%audit", 0) == len(receipts)
        assert len(channel.notices) == 2  # no second alarm
    finally:
        broker.shutdown()


def _never_consumed(label: dict[str, str], queue_id: int) -> float:
    return float(metrics.NEVER_CONSUMED.labels(queue_id=str(queue_id), **label)._value.get())


def test_fan_out_where_only_one_group_lost_it_resends_to_that_group_only(
    rel: Reliability, store: Path, clock: Clock
) -> None:
    broker = start(store)
    try:
        receipts = send(broker, ["m-1", "after-1", "after-2"])
        stage(rel, {"m-1": receipts["m-1"]}, groups=("billing", "audit"))
        r = receipts["m-1"]
        # both groups read past m-1's offset; billing received and confirmed it, audit never got it
        for group in ("billing", "audit"):
            set_progress(rel, r.queue_offset + 1, group=group, topic=TOPIC, queue_id=r.queue_id)
        add_log(rel, "m-1", T0, consumer_group="billing", topic=TOPIC, queue_id=r.queue_id)
        set_inbox(rel, "m-1", "billing", status=StubStatus.CONFIRMED)
        sw, producer = sweeper(rel, broker, clock)
        try:
            assert sw.run_once().resent == 1
        finally:
            producer.shutdown()
        assert broker.get_max_offset("%RETRY%audit", 0) == 1
        assert broker.get_max_offset("%RETRY%billing", 0) in (0, None)
        assert get_inbox(rel, "m-1", "billing").resend_count == 0
    finally:
        broker.shutdown()
