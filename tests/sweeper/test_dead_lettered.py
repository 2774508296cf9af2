"""A message the guard dead-letters, end to end with the sweeper, on every backend.

What a user needs (docs/guarantees.md: each group's row "ends CONFIRMED, or DEAD with one notification to a
person"): a handler that keeps failing ends its group's row DEAD, a person is told once — the log line and
each channel — nothing is re-sent meanwhile (a re-send cannot help it), and once the handler is fixed,
``revive`` delivers the message again and it is applied once. A delivery dead-lettered for its *body* (another
body under the staged id) does not keep the staged body from its group: it is re-sent like any stuck row.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from reliable import ConsumeResult, Envelope, GuardedHandler, Reason, Reliability, idempotent_consumer
from reliable.models import utcnow
from reliable.outbox import payload_hash
from reliable.sweeper import FixedBackoff, Sweeper, revive
from reliable.types import StubStatus
from tests.core.guard_helpers import apply, env, ledger, ledger_md
from tests.sweeper.helpers import (
    Clock,
    MemoryChannel,
    QueueSender,
    add_stub,
    clean,
    get_inbox,
    get_stub,
    set_inbox,
)

STUCK_AFTER_S = 600


@pytest.fixture
def rel(db_url: str) -> Iterator[Reliability]:
    r = Reliability(db_url, redis_url="", max_sends=3, stuck_after_s=STUCK_AFTER_S, max_attempts=2)
    clean(r.engine)
    ledger_md.create_all(r.engine, checkfirst=True)
    with r.engine.begin() as conn:
        conn.execute(ledger.delete())
    yield r
    r.close()


def guarded(
    rel: Reliability, group: str, failing: dict[str, bool], ran: list[str] | None = None
) -> GuardedHandler:
    def handler(e: Envelope, session: Session) -> None:
        if ran is not None:
            ran.append(group)
        if failing.get(group):
            raise RuntimeError(f"{group} cannot handle {e.message_id}")
        apply(e, session, note=group)

    return idempotent_consumer(rel, group=group, registry=CollectorRegistry())(handler)


def applied(rel: Reliability) -> dict[str, int]:
    with rel.engine.connect() as conn:
        rows = conn.execute(select(ledger.c.note, func.count()).group_by(ledger.c.note)).all()
    return {str(note): int(n) for note, n in rows}


def sweeper_at(rel: Reliability, sender: QueueSender, clock: Clock, channel: MemoryChannel) -> Sweeper:
    return Sweeper(rel, sender, backoff=FixedBackoff((10.0,)), channels=[channel], clock=clock)


def dead_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("stub DEAD")]


def test_a_handler_that_keeps_failing_ends_dead_a_person_is_told_once_and_revive_applies_it(
    rel: Reliability, sender: QueueSender, caplog: pytest.LogCaptureFixture
) -> None:
    add_stub(rel, "m", groups=["billing", "audit"], queue_offset=5)
    failing, ran = {"audit": True}, list[str]()
    billing, audit = guarded(rel, "billing", failing, ran), guarded(rel, "audit", failing, ran)
    assert billing.decide(env("m", b"body-m")).reason is Reason.PROCESSED
    assert audit.decide(env("m", b"body-m")).reason is Reason.HANDLER_FAILED
    last = audit.decide(env("m", b"body-m", reconsume_times=1))
    assert (last.reason, last.result) == (Reason.MAX_ATTEMPTS, ConsumeResult.DEAD_LETTER)

    row = get_inbox(rel, "m", "audit")
    assert row.status is StubStatus.DEAD and row.attempts == 2
    assert row.last_error is not None and "max_attempts" in row.last_error
    assert get_inbox(rel, "m", "billing").status is StubStatus.CONFIRMED
    assert get_stub(rel, "m").status is StubStatus.DEAD  # some group gave up: the message needs a person

    channel, clock = MemoryChannel(), Clock(utcnow())
    sweeper = sweeper_at(rel, sender, clock, channel)
    with caplog.at_level(logging.ERROR, logger="reliable.sweeper"):
        first = sweeper.run_once()
        clock.advance(STUCK_AFTER_S * 6)  # long past stuck_after: still nothing to re-send, nobody re-told
        second = sweeper.run_once()
    assert (first.dead_lettered, first.resent, first.notified) == (1, 0, 1)
    assert (second.dead_lettered, second.resent, second.notified) == (0, 0, 0)
    [notice] = channel.notices
    assert (notice.message_id, notice.consumer_group, notice.topic) == ("m", "audit", "orders")
    assert "max_attempts" in notice.reason and "RuntimeError" in notice.reason
    assert len(dead_lines(caplog)) == 1 and "group=audit" in dead_lines(caplog)[0]
    assert sender.sent == []

    # another copy (a resend meant for another group, a producer's retry) does not run the failing handler
    # again: the group gave up, a person decides
    ran.clear()
    copy_for_others = audit.decide(env("m", b"body-m"))
    assert (copy_for_others.reason, copy_for_others.result) == (Reason.GAVE_UP, ConsumeResult.DEAD_LETTER)
    assert ran == [] and get_inbox(rel, "m", "audit").status is StubStatus.DEAD
    assert get_inbox(rel, "m", "audit").attempts == 2
    # a resend labelled for billing (a Kafka or RocketMQ 5.x sender puts it on the topic): settled, acked as
    # a duplicate — it was dead-lettered again, one more dead letter per resend for another group
    for_billing = audit.decide(replace(env("m", b"body-m"), target_group="billing"))
    assert (for_billing.reason, for_billing.result) == (Reason.DUPLICATE_OF_DEAD, ConsumeResult.SUCCESS)
    for_audit = audit.decide(replace(env("m", b"body-m"), target_group="audit"))
    assert (for_audit.reason, for_audit.result) == (Reason.GAVE_UP, ConsumeResult.DEAD_LETTER)
    assert ran == [] and get_inbox(rel, "m", "audit").attempts == 2

    failing["audit"] = False  # the handler is fixed; a person revives the message for that group
    assert revive(rel.engine, ["m"], now=clock.now, group="audit") == 1
    assert sweeper.run_once().resent == 1
    [copy] = sender.sent
    assert (copy.message_id, copy.target_group, copy.body) == ("m", "audit", b"body-m")
    assert audit.decide(env("m", copy.body)).reason is Reason.PROCESSED
    assert get_stub(rel, "m").status is StubStatus.CONFIRMED
    assert applied(rel) == {"billing": 1, "audit": 1}


def test_a_give_up_at_the_brokers_last_delivery_is_not_undone_by_the_next_copy(
    rel: Reliability, sender: QueueSender
) -> None:
    """The broker's retries end before the guard's budget (a Kafka retry chain or a RocketMQ group limit
    shorter than ``max_attempts``): its last delivery fails, the group gives up with one failed attempt.
    Another copy of the message — a resend meant for another group, a producer's retry — must not run the
    failing handler again (and dead-letter it again) any more than after ``max_attempts`` failures."""
    add_stub(rel, "m", groups=["billing", "audit"], queue_offset=5)
    failing, ran = {"audit": True}, list[str]()
    audit = guarded(rel, "audit", failing, ran)
    last = audit.decide(replace(env("m", b"body-m"), last_attempt=True))
    assert (last.reason, last.result) == (Reason.MAX_ATTEMPTS, ConsumeResult.DEAD_LETTER)
    assert get_inbox(rel, "m", "audit").status is StubStatus.DEAD and ran == ["audit"]

    ran.clear()
    copy_for_others = audit.decide(env("m", b"body-m"))
    assert (copy_for_others.reason, copy_for_others.result) == (Reason.GAVE_UP, ConsumeResult.DEAD_LETTER)
    assert ran == [] and get_inbox(rel, "m", "audit").status is StubStatus.DEAD

    failing["audit"] = False  # fixed and revived: the next copy is applied
    assert revive(rel.engine, ["m"], now=utcnow(), group="audit") == 1
    assert audit.decide(env("m", b"body-m")).reason is Reason.PROCESSED
    assert applied(rel) == {"audit": 1}


def test_a_stray_body_under_a_staged_id_does_not_keep_the_staged_body_from_its_group(
    rel: Reliability, sender: QueueSender
) -> None:
    add_stub(rel, "m", queue_offset=5)
    set_inbox(rel, "m", "billing", payload_hash=payload_hash(b"body-m"))
    billing = guarded(rel, "billing", {})
    stray = billing.decide(env("m", b"forged"))
    assert (stray.reason, stray.result) == (Reason.PAYLOAD_MISMATCH, ConsumeResult.DEAD_LETTER)
    assert get_inbox(rel, "m").status is StubStatus.PENDING  # the staged body was never received

    clock = Clock(utcnow() + dt.timedelta(seconds=STUCK_AFTER_S + 1))
    channel = MemoryChannel()
    summary = sweeper_at(rel, sender, clock, channel).run_once()
    assert (summary.resent, summary.stuck_recovered, summary.dead_lettered) == (1, 1, 0)
    [copy] = sender.sent
    assert copy.body == b"body-m"
    assert billing.decide(env("m", copy.body)).reason is Reason.PROCESSED
    assert get_stub(rel, "m").status is StubStatus.CONFIRMED
    assert applied(rel) == {"billing": 1} and channel.notices == []


def test_the_sweepers_own_give_up_is_told_once_without_channels(
    rel: Reliability, sender: QueueSender, caplog: pytest.LogCaptureFixture
) -> None:
    """Its give-up writes the delivered ``log`` row that tells the next rounds a person knows."""
    add_stub(rel, "spent", send_count=3, queue_offset=None)  # budget spent, never reached the broker
    clock = Clock()
    sweeper = Sweeper(rel, sender, backoff=FixedBackoff((10.0,)), clock=clock)
    with caplog.at_level(logging.ERROR, logger="reliable.sweeper"):
        assert sweeper.run_once().dead == 1
        clock.advance(3600)
        assert sweeper.run_once().dead_lettered == 0
    assert len(dead_lines(caplog)) == 1


class _HoldsEverything(QueueSender):
    """The broker holds offsets 0..99 of every queue (the loss probe answers)."""

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int:
        return 100


def test_a_message_that_carried_the_never_consumed_alarm_is_still_told_when_it_ends_dead(
    rel: Reliability,
) -> None:
    """The never-consumed alarm is kept on one waiting message's notice rows. The operator fixes the
    subscription, that message arrives and its handler keeps failing: the guard sets the row DEAD. The
    alarm's rows are not a give-up's notice — a person must still hear that this message is dead."""
    now = utcnow()
    hour_ago = now - dt.timedelta(hours=1)
    for mid, offset in (("m", 5), ("n", 6)):
        add_stub(
            rel, mid, queue_offset=offset, created_at=hour_ago, updated_at=hour_ago, last_sent_at=hour_ago
        )
    channel, clock = MemoryChannel(), Clock(now)
    sweeper = Sweeper(rel, _HoldsEverything(), backoff=FixedBackoff((10.0,)), channels=[channel], clock=clock)
    assert sweeper.run_once().never_consumed == 1  # one alarm per queue, kept on one waiting message
    [alarm] = channel.notices
    assert alarm.kind.value == "never_consumed"

    failing = guarded(rel, "billing", {"billing": True})
    for attempt in (0, 1):
        failing.decide(env(alarm.message_id, f"body-{alarm.message_id}".encode(), reconsume_times=attempt))
    assert get_inbox(rel, alarm.message_id).status is StubStatus.DEAD
    clock.advance(3600)
    assert sweeper.run_once().dead_lettered == 1
    dead = [n for n in channel.notices if n.kind.value == "dead"]
    assert [(n.message_id, n.consumer_group) for n in dead] == [(alarm.message_id, "billing")]
    clock.advance(3600)
    assert sweeper.run_once().dead_lettered == 0  # told once
