"""Whole rounds per (group, message): targeted resends, failed sends, the fallback without a probe,
give-up with one notice per (message, group, channel), revive, retention — on every backend."""

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
from tests.sweeper.helpers import (
    T0,
    TOLD,
    Clock,
    MemoryChannel,
    QueueSender,
    add_inbox_without_stub,
    add_log,
    add_stub,
    get_inbox,
    get_stub,
    set_inbox,
    set_progress,
)

BACKOFF = FixedBackoff((10.0, 20.0, 40.0))
DAY = 86400.0


def make(rel: Reliability, sender: QueueSender, clock: Clock, **kw: object) -> Sweeper:
    return Sweeper(rel, sender, backoff=BACKOFF, clock=clock, **kw)  # type: ignore[arg-type]


def test_overtaken_row_gets_a_targeted_resend_recorded_on_the_groups_row(
    rel: Reliability, clock: Clock
) -> None:
    sender = QueueSender(retry_prefix="%RETRY%")
    add_stub(rel, "lost", queue_id=2, queue_offset=5, tags="created")
    set_progress(rel, 8, queue_id=2)  # the group passed offset 5 without a delivery of it
    summary = make(rel, sender, clock).run_once()
    assert (summary.selected, summary.resent, summary.dead, summary.send_failures) == (1, 1, 0, 0)
    [msg] = sender.sent
    assert (msg.message_id, msg.topic, msg.body, msg.target_group, msg.tags) == (
        "lost",
        "orders",
        b"body-lost",
        "billing",
        "created",
    )
    [receipt] = sender.receipts
    row = get_inbox(rel, "lost")
    assert row.status is StubStatus.PENDING
    assert (row.resend_count, row.queue_id, row.queue_offset) == (1, receipt.queue_id, receipt.queue_offset)
    assert row.resend_at == T0 + dt.timedelta(seconds=20)  # backoff(2); no progress on the retry queue
    assert row.last_error is None
    stub = get_stub(rel, "lost")  # the topic-wide send is untouched
    assert (stub.send_count, stub.queue_id, stub.queue_offset) == (1, 2, 5)


def test_the_next_round_judges_the_targeted_copy_not_the_stub(rel: Reliability, clock: Clock) -> None:
    sender = QueueSender(queues=1, start=0, retry_prefix="%RETRY%")
    add_stub(rel, "lost", queue_offset=5)
    set_progress(rel, 9)
    sweeper = make(rel, sender, clock)
    assert sweeper.run_once().resent == 1  # lands at %RETRY%billing queue 0 offset 0
    clock.advance(3600)
    set_progress(rel, 0, topic="%RETRY%billing")  # the group read its retry queue up to (and past) it…
    assert sweeper.run_once().resent == 1  # … without a delivery of it: overtaken there, sent again
    assert get_inbox(rel, "lost").queue_offset == 1


def test_failed_send_counts_records_error_and_backs_off(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    add_stub(rel, "lost", queue_id=1, queue_offset=3)
    set_progress(rel, 3, queue_id=1)
    sender.fail_next = 1
    summary = make(rel, sender, clock).run_once()
    assert (summary.resent, summary.send_failures) == (0, 1)
    row = get_inbox(rel, "lost")
    assert row.resend_count == 1
    assert row.last_error is not None and "ConnectionError" in row.last_error
    assert row.resend_at == T0 + dt.timedelta(seconds=20)
    assert (row.queue_id, row.queue_offset) == (None, None)  # no copy landed: the stub's send still counts


def test_one_batch_of_landed_and_failed_resends_records_each_rows_own_outcome(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    """A batch's outcomes are written together: a failed copy must keep its row's last landed position and
    its attempts, a landed one must take its own receipt and reset them — never each other's."""
    for mid in ("a", "b", "c"):
        add_stub(rel, mid, queue_offset=None, resend_at=T0 - dt.timedelta(seconds=ord("z") - ord(mid[0])))
        set_inbox(rel, mid, resend_count=1, queue_id=3, queue_offset=70 + ord(mid[0]), attempts=2)
    set_progress(rel, 200, queue_id=3)  # the group passed every earlier copy: all three are lost
    sender.fail_next = 1  # the first send of the batch ("a", the longest due) is refused
    summary = make(rel, sender, clock).run_once()
    assert (summary.resent, summary.send_failures) == (2, 1)
    failed = get_inbox(rel, "a")
    assert (failed.resend_count, failed.queue_id, failed.queue_offset, failed.attempts) == (2, 3, 70 + 97, 2)
    assert failed.last_error is not None and "ConnectionError" in failed.last_error
    receipts = {m.message_id: r for m, r in zip(sender.sent, sender.receipts, strict=True)}
    for mid in ("b", "c"):
        row = get_inbox(rel, mid)
        r = receipts[mid]
        assert (row.resend_count, row.queue_id, row.queue_offset, row.attempts) == (
            2,
            r.queue_id,
            r.queue_offset,
            0,
        )
        assert row.last_error is None
    assert failed.resend_at == T0 + dt.timedelta(seconds=40)  # backoff(3): the group's third send


def test_two_groups_lacking_one_message_in_one_batch_each_keep_their_own_outcome(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    """Fan-out: both groups' rows of one message are resent in the same batch and recorded together; one
    copy is refused. Each group's row must take its own outcome — never the other group's receipt, error
    or position."""
    offsets = {"billing": 170, "audit": 180}  # where each group's last targeted copy landed
    add_stub(rel, "m", groups=list(offsets), queue_offset=None)
    for group, offset in offsets.items():
        set_inbox(rel, "m", group, resend_count=1, queue_id=3, queue_offset=offset, attempts=2)
        set_progress(rel, 200, group=group, queue_id=3)  # each group passed its copy: both are lost
    sender.fail_next = 1  # whichever row goes first is refused
    summary = make(rel, sender, clock).run_once()
    assert (summary.resent, summary.send_failures) == (1, 1)
    [landed_msg] = sender.sent
    [receipt] = sender.receipts
    assert landed_msg.target_group in offsets
    landed = get_inbox(rel, "m", landed_msg.target_group)
    assert (landed.resend_count, landed.queue_id, landed.queue_offset, landed.attempts) == (
        2,
        receipt.queue_id,
        receipt.queue_offset,
        0,
    )
    assert landed.last_error is None
    failed_group = next(g for g in offsets if g != landed_msg.target_group)
    failed = get_inbox(rel, "m", failed_group)
    assert (failed.resend_count, failed.queue_id, failed.queue_offset, failed.attempts) == (
        2,
        3,
        offsets[failed_group],
        2,
    )
    assert failed.last_error is not None and "ConnectionError" in failed.last_error


def test_without_probe_or_progress_a_copy_waits_then_is_resent_when_too_old(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    """RabbitMQ has no probe: a never-received copy is neither re-sent at once nor left PENDING forever."""
    add_stub(rel, "quiet", queue_offset=7)
    sweeper = make(rel, sender, clock, max_unconfirmed_age_s=DAY)
    summary = sweeper.run_once()
    assert (summary.resent, summary.held) == (0, 1)
    clock.advance(DAY)
    assert sweeper.run_once().resent == 1
    assert sender.ids() == ["quiet"]


def test_give_up_after_budget_marks_dead_with_one_notice_per_channel(
    rel: Reliability, sender: QueueSender, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    add_stub(rel, "doomed", queue_offset=None)  # the producer's send never landed
    channel = MemoryChannel()
    sweeper = make(rel, sender, clock, channels=[channel])
    sender.fail_next = 10
    for _ in range(2):  # sends 2 and 3 fail
        sweeper.run_once()
        clock.advance(3600)
    assert get_inbox(rel, "doomed").resend_count == 2
    with caplog.at_level("ERROR", logger="reliable.sweeper"):
        summary = sweeper.run_once()
    assert (summary.dead, summary.resent, summary.notified) == (1, 0, 1)
    row = get_inbox(rel, "doomed")
    assert row.status is StubStatus.DEAD
    assert row.last_error is not None and row.last_error.startswith("DEAD: no send reached the broker")
    assert get_stub(rel, "doomed").status is StubStatus.DEAD
    assert sum("stub DEAD message_id=doomed" in r.getMessage() for r in caplog.records) == 1
    [notice] = channel.notices
    assert (notice.message_id, notice.consumer_group, notice.send_count) == ("doomed", "billing", 3)
    clock.advance(3600)
    summary = sweeper.run_once()
    assert (summary.dead, summary.notified) == (0, 0)  # once


def test_fan_out_gives_up_per_group_with_one_notice_per_message_group_and_channel(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    add_stub(rel, "m", groups=["billing", "audit", "search"], send_count=3, queue_offset=5)
    for group in ("billing", "audit", "search"):
        set_progress(rel, 9, group=group)
    add_log(rel, "m", T0 - dt.timedelta(seconds=5), consumer_group="search")  # search received it
    set_inbox(rel, "m", "search", status=StubStatus.CONFIRMED)
    a, b = MemoryChannel(), MemoryChannel("memory2")
    summary = make(rel, sender, clock, channels=[a, b]).run_once()
    assert summary.dead == 2 and sender.sent == []
    assert {get_inbox(rel, "m", g).status for g in ("billing", "audit")} == {StubStatus.DEAD}
    assert get_inbox(rel, "m", "search").status is StubStatus.CONFIRMED
    assert get_stub(rel, "m").status is StubStatus.DEAD
    for channel in (a, b):
        assert sorted(n.consumer_group for n in channel.notices) == ["audit", "billing"]
    with rel.engine.connect() as conn:
        told = select(StubNotification.consumer_group, StubNotification.channel).where(TOLD)
        keys = conn.execute(told).all()
    channels = ("memory", "memory2", "log")  # the log line went out at once; its row remembers it
    assert sorted(keys) == sorted((g, c) for g in ("audit", "billing") for c in channels)


def test_fan_out_resends_only_to_the_group_that_lacks_the_message(rel: Reliability, clock: Clock) -> None:
    sender = QueueSender(retry_prefix="%RETRY%")
    add_stub(rel, "m", groups=["billing", "audit"], queue_offset=5)
    set_progress(rel, 9, group="billing")
    set_progress(rel, 9, group="audit")
    add_log(rel, "m", T0 - dt.timedelta(seconds=30), consumer_group="billing")
    set_inbox(rel, "m", "billing", status=StubStatus.CONFIRMED)
    assert make(rel, sender, clock).run_once().resent == 1
    assert [(m.message_id, m.target_group) for m in sender.sent] == [("m", "audit")]


def test_an_inbox_row_without_a_stub_is_held_with_its_reason_and_the_batch_goes_on(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    """A due row whose stub is gone (nothing to re-send: there is no body) must not stop, or empty, the
    re-send of the rows around it in the same batch; it waits with the reason a person can read."""
    add_stub(rel, "a-lost", queue_offset=None, resend_at=T0 - dt.timedelta(seconds=30))
    add_stub(rel, "c-lost", queue_offset=None, resend_at=T0 - dt.timedelta(seconds=10))
    add_inbox_without_stub(rel, "b-no-stub", resend_at=T0 - dt.timedelta(seconds=20))
    summary = make(rel, sender, clock, stuck_after_s=600).run_once()
    assert (summary.selected, summary.resent, summary.dead) == (3, 2, 0)
    assert [(m.message_id, m.topic, m.body) for m in sender.sent] == [
        ("a-lost", "orders", b"body-a-lost"),
        ("c-lost", "orders", b"body-c-lost"),
    ]
    held = get_inbox(rel, "b-no-stub")
    assert (held.status, held.resend_count) == (StubStatus.PENDING, 0)
    assert held.last_error == "no message_stub row: nothing to re-send"
    assert held.resend_at == T0 + dt.timedelta(seconds=600)


def test_an_inbox_row_whose_stub_is_gone_is_given_up_with_a_notice_once_unconfirmed_too_long(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    """No stub, no body: the sweeper cannot re-send, so holding the row round after round would leave the
    message lost with nobody told. It waits while a copy already out may still arrive, then goes DEAD and a
    person is told, once, like any other give-up."""
    add_inbox_without_stub(
        rel, "no-stub", groups=["billing", "audit"], resend_at=T0 - dt.timedelta(seconds=20)
    )
    set_inbox(rel, "no-stub", "audit", status=StubStatus.CONFIRMED)  # audit received it before the delete
    channel = MemoryChannel()
    sweeper = make(rel, sender, clock, stuck_after_s=600, max_unconfirmed_age_s=DAY, channels=[channel])
    assert sweeper.run_once().dead == 0  # an hour old: a copy may still be on its way
    assert get_inbox(rel, "no-stub").status is StubStatus.PENDING
    assert channel.notices == []
    clock.advance(DAY - 3600)  # created a day ago now
    summary = sweeper.run_once()
    assert (summary.selected, summary.dead, summary.resent, summary.notified) == (1, 1, 0, 1)
    row = get_inbox(rel, "no-stub")
    assert row.status is StubStatus.DEAD and row.resend_at is None
    assert row.last_error is not None and row.last_error.startswith("DEAD: no message_stub row")
    assert get_inbox(rel, "no-stub", "audit").status is StubStatus.CONFIRMED  # only the group that lacks it
    [notice] = channel.notices
    assert (notice.message_id, notice.consumer_group, notice.topic) == ("no-stub", "billing", "")
    assert "longer than 1 day" in notice.reason and notice.reason.endswith("stage the message again)")
    clock.advance(DAY)
    assert (sweeper.run_once().selected, len(channel.notices)) == (0, 1)  # told once
    assert sender.sent == []


def test_give_up_waits_while_the_last_copy_is_queued(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    add_stub(rel, "last", send_count=3, queue_offset=50)
    set_progress(rel, 49)
    sweeper = make(rel, sender, clock)
    assert sweeper.run_once().dead == 0
    clock.advance(3600)
    set_progress(rel, 50)  # the consumer reached its offset and it was not there
    assert sweeper.run_once().dead == 1


def test_revive_gives_a_new_budget_and_is_resent(rel: Reliability, sender: QueueSender, clock: Clock) -> None:
    add_stub(rel, "dead", groups=["billing", "audit"], status=StubStatus.DEAD, send_count=3)
    add_stub(rel, "ok", status=StubStatus.CONFIRMED)
    with pytest.raises(InvalidStubStateError):
        revive(rel.engine, ["dead", "ok"], now=T0)
    with pytest.raises(StubNotFoundError):
        revive(rel.engine, ["dead", "nope"], now=T0)
    assert get_inbox(rel, "dead").status is StubStatus.DEAD  # all or nothing
    assert revive(rel.engine, ["dead"], now=T0, group="audit") == 1
    row = get_inbox(rel, "dead", "audit")
    assert (row.status, row.resend_count, row.resend_at) == (StubStatus.PENDING, 0, T0)
    assert get_inbox(rel, "dead", "billing").status is StubStatus.DEAD
    assert get_stub(rel, "dead").status is StubStatus.DEAD  # billing still gave up
    assert revive(rel.engine, ["dead"], now=T0) == 1
    assert get_stub(rel, "dead").status is StubStatus.PENDING
    set_progress(rel, 5, group="billing")
    set_progress(rel, 5, group="audit")
    assert make(rel, sender, clock).run_once().resent == 2


def log_ids(rel: Reliability) -> set[tuple[str, str]]:
    with rel.engine.connect() as conn:
        return {(m, g) for m, g in conn.execute(select(MessageLog.message_id, MessageLog.consumer_group))}


def test_retention_never_drops_evidence_of_a_pending_or_dead_group(rel: Reliability) -> None:
    old, new = T0 - dt.timedelta(days=8), T0 - dt.timedelta(minutes=5)
    add_stub(rel, "fan", groups=["billing", "audit"])
    set_inbox(rel, "fan", "billing", status=StubStatus.CONFIRMED)
    for status, name in [(StubStatus.DEAD, "dead"), (StubStatus.CONFIRMED, "confirmed")]:
        add_stub(rel, name, status=status)
        add_log(rel, name, old)
    for group in ("billing", "audit"):
        add_log(rel, "fan", old, consumer_group=group)
    add_stub(rel, "confirmed-recent", status=StubStatus.CONFIRMED)
    add_log(rel, "confirmed-recent", new)
    add_log(rel, "no-row", old)
    week = dt.timedelta(days=7)
    assert purge_logs(rel.engine, now=T0, retention=week, batch=2) == 3
    assert log_ids(rel) == {("fan", "audit"), ("dead", "billing"), ("confirmed-recent", "billing")}


def test_bad_configuration_is_a_typed_error(rel: Reliability, sender: QueueSender) -> None:
    with pytest.raises(SweeperConfigError):
        Sweeper(rel, sender, batch=0)
    with pytest.raises(SweeperConfigError):
        Sweeper(rel, sender, max_unconfirmed_age_s=0)
    with pytest.raises(SweeperConfigError):
        FixedBackoff((1.0, 0.0))


def test_round_with_many_batches_handles_each_row_once(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    for i in range(23):
        add_stub(rel, f"m{i:02d}", queue_offset=None, resend_at=T0 - dt.timedelta(seconds=100 - i))
    summary = make(rel, sender, clock, batch=5).run_once()
    assert summary.resent == 23
    assert sorted(sender.ids()) == [f"m{i:02d}" for i in range(23)]
    with rel.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(StubNotification).where(TOLD)).scalar() == 0


class _TopicOnlySender(QueueSender):
    """Like Kafka's and RocketMQ 5.x's senders: a targeted copy lands on the topic, where every group gets
    it."""

    targets_groups = False


@pytest.mark.parametrize("refused", [False, True])
def test_a_sender_that_cannot_target_sends_one_copy_for_all_groups_owed_it(
    rel: Reliability, clock: Clock, refused: bool
) -> None:
    """The producer's send failed: every group's row is due in the same round. A sender that cannot address
    one group put each group's copy on the topic, so every group received one copy per group (three groups,
    three copies each, every round). One copy serves them all, and each row records it as its own."""
    sender = _TopicOnlySender()
    groups = ["billing", "audit", "search"]
    add_stub(rel, "m", groups=groups, queue_offset=None)
    add_stub(rel, "z", groups=["billing"], queue_offset=None)  # selected after m (id order)
    sender.fail_next = 1 if refused else 0
    summary = make(rel, sender, clock).run_once()
    assert sorted(sender.ids()) == (["z"] if refused else ["m", "z"])  # one copy of m, however many groups
    rows = [get_inbox(rel, "m", g) for g in groups]
    assert {r.resend_count for r in rows} == {1}
    if refused:
        assert summary.send_failures == 3 and all("ConnectionError" in (r.last_error or "") for r in rows)
    else:
        [receipt] = [r for m, r in zip(sender.sent, sender.receipts, strict=True) if m.message_id == "m"]
        assert {(r.queue_id, r.queue_offset, r.last_error) for r in rows} == {
            (receipt.queue_id, receipt.queue_offset, None)
        }


def test_one_copy_per_message_holds_when_its_rows_fall_into_two_batches_of_a_round(
    rel: Reliability, clock: Clock
) -> None:
    """Three groups owed m, batches of two rows: m's rows span two batches of one round. Each batch sent
    its own copy (two copies to every group per round); the round's one copy serves all three rows."""
    sender = _TopicOnlySender()
    groups = ["audit", "billing", "search"]
    for mid in ("m", "n"):
        add_stub(rel, mid, groups=groups, queue_offset=None)
    summary = make(rel, sender, clock, batch=2).run_once()
    assert summary.resent == 6
    assert sorted(sender.ids()) == ["m", "n"]
    for mid in ("m", "n"):
        rows = [get_inbox(rel, mid, g) for g in groups]
        assert len({(r.queue_id, r.queue_offset) for r in rows}) == 1 and rows[0].queue_offset is not None


class _HoldsEverything:
    """A probe: the broker holds every copy (its max offset is far past each)."""

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return 10_000


def test_on_a_shared_topic_a_never_consumed_group_is_not_resent_to_when_its_rows_age(
    rel: Reliability, clock: Clock
) -> None:
    """A group listed for a topic but not deployed yet: its rows are never consumed. Where a resend reaches
    that group alone (RocketMQ's %RETRY%{group}) the sweeper re-sends once they are older than
    max_unconfirmed_age (a group that started from the queue's end reads it); on a shared topic (Kafka,
    RocketMQ 5.x) every other group would take each copy, at every resend for days: held, the alarm stands."""
    for mid in ("nc-1", "nc-2"):
        add_stub(rel, mid, groups=["audit"], queue_offset=5, last_sent_at=T0 - dt.timedelta(days=3))
    shared = make(rel, _TopicOnlySender(), clock, probe=_HoldsEverything())
    summary = shared.run_once()
    assert (summary.resent, summary.never_consumed) == (0, 1)  # held, one alarm for the queue
    own = QueueSender(retry_prefix="%RETRY%")
    clock.advance(601)  # past the hold (stuck_after)
    assert make(rel, own, clock, probe=_HoldsEverything()).run_once().resent == 2
    assert {m.target_group for m in own.sent} == {"audit"}
