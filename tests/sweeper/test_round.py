"""Whole rounds: resend bookkeeping, failed sends, give-up, revive, retention — on every backend."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import func, select

from reliable import Reliability
from reliable.errors import InvalidStubStateError, StubNotFoundError
from reliable.models import MessageLog, StubNotification
from reliable.sweeper import FixedBackoff, Sweeper, purge_logs, revive
from reliable.sweeper.errors import SweeperConfigError
from reliable.types import StubStatus
from tests.sweeper.helpers import T0, Clock, QueueSender, add_log, add_stub, get_stub, set_progress

BACKOFF = FixedBackoff((10.0, 20.0, 40.0))


def make(rel: Reliability, sender: QueueSender, clock: Clock, **kw: object) -> Sweeper:
    return Sweeper(rel, sender, backoff=BACKOFF, clock=clock, **kw)  # type: ignore[arg-type]


def test_resend_updates_bookkeeping(rel: Reliability, sender: QueueSender, clock: Clock) -> None:
    add_stub(rel, "lost", send_count=1, queue_id=2, queue_offset=5, tags="created")
    set_progress(rel, 8, queue_id=2)
    summary = make(rel, sender, clock).run_once()
    assert (summary.selected, summary.resent, summary.dead, summary.send_failures) == (1, 1, 0, 0)
    [msg] = sender.sent
    assert (msg.message_id, msg.topic, msg.body, msg.consumer_group, msg.tags, msg.send_count) == (
        "lost",
        "orders",
        b"body-lost",
        "billing",
        "created",
        1,
    )
    [receipt] = sender.receipts
    row = get_stub(rel, "lost")
    assert row.status is StubStatus.PENDING
    assert (row.send_count, row.queue_id, row.queue_offset) == (2, receipt.queue_id, receipt.queue_offset)
    assert row.last_sent_at == T0
    assert row.resend_at == T0 + dt.timedelta(seconds=20)  # backoff(2); no progress row on the new queue
    assert row.last_error is None


def test_second_round_does_not_resend_what_is_not_due_yet(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    add_stub(rel, "lost")
    sweeper = make(rel, sender, clock)
    sweeper.run_once()
    clock.advance(19)
    assert sweeper.run_once().resent == 0
    clock.advance(1)  # the copy landed on a queue nobody consumes: it is queued, not lost
    assert sweeper.run_once().resent == 0
    assert sender.ids() == ["lost"]


def test_failed_send_counts_records_error_and_backs_off(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    add_stub(rel, "lost", send_count=1, queue_id=1, queue_offset=3, last_sent_at=T0 - dt.timedelta(hours=1))
    set_progress(rel, 3, queue_id=1)
    sender.fail_next = 1
    summary = make(rel, sender, clock).run_once()
    assert (summary.resent, summary.send_failures) == (0, 1)
    row = get_stub(rel, "lost")
    assert row.send_count == 2
    assert row.last_error is not None and "ConnectionError" in row.last_error
    assert row.resend_at == T0 + dt.timedelta(seconds=20)
    assert (row.queue_id, row.queue_offset) == (1, 3)  # still where the last copy landed
    assert row.last_sent_at == T0 - dt.timedelta(hours=1)


def test_give_up_after_budget_marks_dead_with_reason(
    rel: Reliability, sender: QueueSender, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    add_stub(rel, "doomed", send_count=1)
    sweeper = make(rel, sender, clock)
    sender.fail_next = 10
    for _ in range(2):  # sends 2 and 3 fail
        sweeper.run_once()
        clock.advance(3600)
    assert get_stub(rel, "doomed").send_count == 3
    with caplog.at_level("ERROR", logger="reliable.sweeper"):
        summary = sweeper.run_once()
    assert summary.dead == 1 and summary.resent == 0
    row = get_stub(rel, "doomed")
    assert row.status is StubStatus.DEAD
    assert row.last_error is not None and row.last_error.startswith("DEAD: no send reached the broker")
    assert sum("stub DEAD message_id=doomed" in r.getMessage() for r in caplog.records) == 1
    clock.advance(3600)
    assert sweeper.run_once().dead == 0  # once


def test_give_up_waits_while_the_last_copy_is_queued(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    add_stub(rel, "last", send_count=3, queue_offset=50)
    set_progress(rel, 49)
    sweeper = make(rel, sender, clock)
    assert sweeper.run_once().dead == 0
    set_progress(rel, 50)  # the consumer reached its offset and it was not there
    assert sweeper.run_once().dead == 1


def test_revive_gives_a_new_budget_and_is_resent(rel: Reliability, sender: QueueSender, clock: Clock) -> None:
    add_stub(rel, "dead", status=StubStatus.DEAD, send_count=3, last_error="DEAD: x")
    add_stub(rel, "ok", status=StubStatus.CONFIRMED)
    with pytest.raises(InvalidStubStateError):
        revive(rel.engine, ["dead", "ok"], now=T0)
    with pytest.raises(StubNotFoundError):
        revive(rel.engine, ["dead", "nope"], now=T0)
    assert get_stub(rel, "dead").status is StubStatus.DEAD  # all or nothing
    assert revive(rel.engine, ["dead"], now=T0) == 1
    row = get_stub(rel, "dead")
    assert (row.status, row.send_count, row.resend_at) == (StubStatus.PENDING, 0, T0)
    assert row.last_error is not None and "after 3 send(s)" in row.last_error
    assert make(rel, sender, clock).run_once().resent == 1
    assert get_stub(rel, "dead").send_count == 1


def log_ids(rel: Reliability) -> set[str]:
    with rel.engine.connect() as conn:
        return set(conn.execute(select(MessageLog.message_id)).scalars())


def test_retention_never_drops_evidence_of_pending_or_dead(rel: Reliability) -> None:
    old, new = T0 - dt.timedelta(days=8), T0 - dt.timedelta(minutes=5)
    for status, name in [
        (StubStatus.PENDING, "pending"),
        (StubStatus.DEAD, "dead"),
        (StubStatus.CONFIRMED, "confirmed"),
        (StubStatus.VOIDED, "voided"),
    ]:
        add_stub(rel, name, status=status)
        add_log(rel, name, old)
    add_stub(rel, "confirmed-recent", status=StubStatus.CONFIRMED)
    add_log(rel, "confirmed-recent", new)
    add_log(rel, "no-stub", old)
    week = dt.timedelta(days=7)
    assert purge_logs(rel.engine, now=T0, retention=week, batch=2) == 3
    assert log_ids(rel) == {"pending", "dead", "confirmed-recent"}
    # retention 0: the seed's "delete the log on success", pending evidence still kept
    assert purge_logs(rel.engine, now=T0, retention=dt.timedelta(0)) == 1
    assert log_ids(rel) == {"pending", "dead"}


def test_a_pending_stub_whose_log_is_old_stays_unsent_by_retention_round(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    """Retention runs in the round; the stuck rule (not a vanished log row) decides the resend."""
    add_stub(rel, "working", queue_offset=1)
    set_progress(rel, 1)
    add_log(rel, "working", T0 - dt.timedelta(seconds=30))
    summary = make(rel, sender, clock, log_retention_s=0).run_once()
    assert summary.resent == 0 and summary.purged == 0
    assert log_ids(rel) == {"working"}


def test_bad_configuration_is_a_typed_error(rel: Reliability, sender: QueueSender) -> None:
    with pytest.raises(SweeperConfigError):
        Sweeper(rel, sender, batch=0)
    with pytest.raises(SweeperConfigError):
        FixedBackoff((1.0, 0.0))


def test_round_with_many_batches_handles_each_stub_once(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    for i in range(23):
        add_stub(rel, f"m{i:02d}", resend_at=T0 - dt.timedelta(seconds=100 - i))
    summary = make(rel, sender, clock, batch=5).run_once()
    assert summary.resent == 23
    assert sorted(sender.ids()) == [f"m{i:02d}" for i in range(23)]
    with rel.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(StubNotification)).scalar() == 0
