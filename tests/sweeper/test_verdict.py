"""The verdict on one selected row: DESIGN.md §3's rules, and the broker's own retry schedule."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from reliable.sweeper.selection import Candidate
from reliable.sweeper.verdict import Facts, RocketMQRetrySchedule, Verdict, judge
from reliable.types import LogOutcome
from tests.sweeper.helpers import T0, candidate

STUCK = dt.timedelta(minutes=10)
MAX_AGE = dt.timedelta(days=1)
SCHEDULE = RocketMQRetrySchedule()

ROW = candidate()
TARGETED = replace(ROW, resend_count=1, inbox_queue_id=0, inbox_queue_offset=3)


def verdict(
    row: Candidate, watermark: int | None = None, broker_max: int | None = None, broker_min: int | None = None
) -> Verdict:
    facts = Facts(watermark=watermark, broker_max=broker_max, broker_min=broker_min)
    return judge(row, facts, now=T0, stuck_after=STUCK, max_unconfirmed_age=MAX_AGE, retry_schedule=SCHEDULE)


@pytest.mark.parametrize(
    ("row", "watermark", "broker_max", "expected"),
    [
        (replace(ROW, stub_queue_offset=None), None, None, Verdict.NEVER_SENT),
        # the group passed the copy's offset without a delivery of it: lost (offset reused after a crash)
        (ROW, 7, None, Verdict.OVERTAKEN),
        (ROW, 9, 12, Verdict.OVERTAKEN),
        # a quiet queue: nothing will ever overtake it, the broker's max offset proves the loss
        (ROW, 3, 7, Verdict.LOST),
        (ROW, 3, 5, Verdict.LOST),
        # …also when the group never consumed that queue
        (ROW, None, 7, Verdict.LOST),
        # the broker has it, the group is behind: merely queued
        (ROW, 6, 8, Verdict.QUEUED),
        # the broker has it, the group never consumed that queue: the alarm, not a resend …
        (ROW, None, 8, Verdict.NEVER_CONSUMED),
        # … unless the copy is younger than stuck_after: the group may be starting up
        (replace(ROW, stub_last_sent_at=T0 - STUCK + dt.timedelta(seconds=1)), None, 8, Verdict.QUEUED),
        # no probe answer: wait for max_unconfirmed_age
        (ROW, 6, None, Verdict.QUEUED),
        (ROW, None, None, Verdict.QUEUED),
        (replace(ROW, stub_last_sent_at=T0 - MAX_AGE), None, None, Verdict.TOO_OLD),
        # a targeted copy: its own position counts, not the stub's
        (TARGETED, 2, 4, Verdict.QUEUED),
        (TARGETED, 3, 4, Verdict.OVERTAKEN),
        (TARGETED, None, 3, Verdict.LOST),
        # every clustering consumer reads its retry topic: no position there yet is no alarm
        (TARGETED, None, 4, Verdict.QUEUED),
    ],
)
def test_never_received(
    row: Candidate, watermark: int | None, broker_max: int | None, expected: Verdict
) -> None:
    assert verdict(row, watermark, broker_max) is expected
    assert expected.resend is (
        expected in {Verdict.NEVER_SENT, Verdict.OVERTAKEN, Verdict.LOST, Verdict.TOO_OLD}
    )


@pytest.mark.parametrize(
    ("row", "watermark", "broker_min", "expected"),
    [
        # the group stopped at offset 3; the broker's retention deleted up to offset 10: the copy at 7 is gone
        (ROW, 3, 10, Verdict.EXPIRED),
        (ROW, 3, 8, Verdict.EXPIRED),
        # the broker still has offset 7: the group is merely behind
        (ROW, 3, 7, Verdict.QUEUED),
        (ROW, 3, None, Verdict.QUEUED),
        # a group that never consumed the queue: gone is gone, not an alarm
        (ROW, None, 10, Verdict.EXPIRED),
        # a targeted copy on %RETRY%{group} deleted by retention too
        (TARGETED, 1, 5, Verdict.EXPIRED),
        # the watermark decides first: the group passed the copy without a delivery of it
        (ROW, 7, 10, Verdict.OVERTAKEN),
    ],
)
def test_a_copy_below_the_brokers_min_offset_was_deleted_by_its_retention(
    row: Candidate, watermark: int | None, broker_min: int | None, expected: Verdict
) -> None:
    assert verdict(row, watermark, 20, broker_min) is expected
    assert Verdict.EXPIRED.resend


def test_too_old_is_measured_from_the_groups_newest_copy() -> None:
    sent_long_ago = replace(TARGETED, created_at=T0 - 3 * MAX_AGE, stub_last_sent_at=T0 - 3 * MAX_AGE)
    assert verdict(replace(sent_long_ago, inbox_updated_at=T0 - dt.timedelta(hours=1))) is Verdict.QUEUED
    assert verdict(replace(sent_long_ago, inbox_updated_at=T0 - MAX_AGE)) is Verdict.TOO_OLD


def stuck(seconds_ago: float, outcome: LogOutcome | None, reconsume_times: int = 0) -> Candidate:
    return replace(
        ROW,
        last_received_at=T0 - dt.timedelta(seconds=seconds_ago),
        last_outcome=outcome,
        last_reconsume_times=reconsume_times,
    )


def test_stuck_outside_any_broker_retry() -> None:
    assert verdict(stuck(3600, None)) is Verdict.STUCK  # the worker died mid-way
    assert verdict(stuck(3600, LogOutcome.SUCCESS)) is Verdict.STUCK  # its confirmation was lost


def test_stuck_waits_out_the_brokers_own_retry_delay() -> None:
    # reconsume_times 10 → delay level 13 = 9 minutes; + stuck_after 10 minutes before the sweeper steps in
    window = dt.timedelta(minutes=19).total_seconds()
    assert verdict(stuck(window - 1, LogOutcome.RETRY, 10)) is Verdict.BROKER_RETRY
    assert verdict(stuck(window, LogOutcome.RETRY, 10)) is Verdict.STUCK
    # reconsume_times 15 → level 18 = 2 hours: well past stuck_after alone
    assert verdict(stuck(3600, LogOutcome.RETRY, 15)) is Verdict.BROKER_RETRY
    # past max_reconsume_times the broker sends it to its DLQ and never again: only the sweeper can help
    assert verdict(stuck(3600, LogOutcome.RETRY, 16)) is Verdict.STUCK


def test_rocketmq_schedule_is_level_three_plus_reconsume_times() -> None:
    assert SCHEDULE(0) == dt.timedelta(seconds=10)  # level 3
    assert SCHEDULE(1) == dt.timedelta(seconds=30)
    assert SCHEDULE(15) == dt.timedelta(hours=2)  # level 18, the last
    assert SCHEDULE(16) is None


@pytest.mark.parametrize(
    ("row", "to_group_only", "expected"),
    [
        # no probe answer (RabbitMQ has no probe), and the group has no position on that queue at all: the
        # alarm, once the copy is older than stuck_after — without a probe as with one
        (ROW, True, Verdict.NEVER_CONSUMED),
        (replace(ROW, stub_last_sent_at=T0 - STUCK + dt.timedelta(seconds=1)), True, Verdict.QUEUED),
        # past max_unconfirmed_age it is re-sent where the resend reaches that group alone; held on a shared
        # topic, as with a probe
        (replace(ROW, stub_last_sent_at=T0 - MAX_AGE), True, Verdict.TOO_OLD),
        (replace(ROW, stub_last_sent_at=T0 - MAX_AGE), False, Verdict.NEVER_CONSUMED),
        # a targeted copy's queue (RocketMQ: %RETRY%{group}) is judged by age alone
        (TARGETED, True, Verdict.QUEUED),
    ],
)
def test_a_group_without_any_position_is_an_alarm_without_a_probe(
    row: Candidate, to_group_only: bool, expected: Verdict
) -> None:
    facts = Facts(watermark=None, broker_max=None, unconsumed=True)
    got = judge(
        row,
        facts,
        now=T0,
        stuck_after=STUCK,
        max_unconfirmed_age=MAX_AGE,
        retry_schedule=SCHEDULE,
        resend_to_group_only=to_group_only,
    )
    assert got is expected


@pytest.mark.parametrize(
    ("sent_ago", "group_only", "expected"),
    [
        (STUCK, False, Verdict.NEVER_CONSUMED),
        (MAX_AGE, False, Verdict.NEVER_CONSUMED),  # a resend reaches every group: held, however old
        (MAX_AGE, True, Verdict.TOO_OLD),  # a resend reaches that group alone
        (STUCK, True, Verdict.NEVER_CONSUMED),
        (STUCK - dt.timedelta(seconds=1), False, Verdict.QUEUED),  # the group may be starting up
    ],
)
def test_a_copy_of_unknown_queue_for_a_group_that_never_consumed_its_topic_raises_the_alarm(
    sent_ago: dt.timedelta, group_only: bool, expected: Verdict
) -> None:
    """A RocketMQ 5.x send does not say its queue, so neither a watermark nor the probe can judge the copy.
    When its group has no watermark on any queue of the topic, it has never consumed there: the alarm, not
    re-sends that every other group of the shared topic would take (they were TOO_OLD at max age)."""
    row = replace(ROW, stub_queue_id=-1, stub_last_sent_at=T0 - sent_ago)
    facts = Facts(watermark=None, broker_max=None, unconsumed=True)
    got = judge(row, facts, now=T0, stuck_after=STUCK, max_unconfirmed_age=MAX_AGE, retry_schedule=SCHEDULE,
                resend_to_group_only=group_only)  # fmt: skip
    assert got is expected
    # a group that has consumed the topic: the age rule, as before
    plain = judge(
        row, Facts(watermark=None, broker_max=None), now=T0, stuck_after=STUCK, max_unconfirmed_age=MAX_AGE,
        retry_schedule=SCHEDULE, resend_to_group_only=group_only,
    )  # fmt: skip
    assert plain is (Verdict.TOO_OLD if sent_ago >= MAX_AGE else Verdict.QUEUED)
