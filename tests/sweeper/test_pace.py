"""The sweeper's background work stays bounded: the purge rests between batches and stops at its budget, and
settling stubs walks them a slice at a time. Time is a fake timer; rests are recorded, never slept."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import text

from reliable import Reliability, outbox
from reliable.errors import ConfigurationError
from reliable.settings import Settings
from reliable.sweeper import purge_logs
from reliable.sweeper.errors import SweeperConfigError
from reliable.sweeper.throttle import Throttle
from reliable.types import StubStatus
from tests.sweeper.helpers import T0, add_log, add_stub, get_stub, set_inbox


def test_throttle_rests_by_its_duty_cycle_and_longer_while_batches_slow_down() -> None:
    half = Throttle(0.5)
    assert half.rest_after(0.1) == pytest.approx(0.1)  # works half the time
    assert half.rest_after(0.2) == pytest.approx(0.4)  # twice as slow as its fastest batch: rests 2× more
    assert half.rest_after(1.0) == pytest.approx(4.0)  # 10× slower: backs off at most 4×
    assert half.rest_after(0.1) == pytest.approx(0.1)  # fast again: back to the plain duty cycle
    assert Throttle(0.25).rest_after(0.1) == pytest.approx(0.3)
    assert Throttle(1.0).rest_after(5.0) == 0.0
    for bad in (0.0, -1.0, 1.5):
        with pytest.raises(SweeperConfigError):
            Throttle(bad)
    with pytest.raises(ConfigurationError):
        Settings.load({"purge_duty_cycle": 0})


class Ticks:
    """A timer that moves half a second each time it is read: every batch 'takes' 0.5 s."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


def _old_logs(rel: Reliability, n: int) -> None:
    for i in range(n):
        add_stub(rel, f"ok{i:02d}", status=StubStatus.CONFIRMED)
        add_log(rel, f"ok{i:02d}", T0 - dt.timedelta(days=8, minutes=-i))


def test_the_purge_rests_between_batches_not_after_the_last(rel: Reliability) -> None:
    _old_logs(rel, 12)
    rests: list[float] = []
    batches: list[int] = []
    purged = purge_logs(
        rel.engine,
        now=T0,
        retention=dt.timedelta(days=7),
        batch=5,
        duty_cycle=0.5,
        rest=rests.append,
        timer=Ticks(),
        on_batch=lambda rows, took: batches.append(rows),
    )
    assert (purged, batches) == (12, [5, 5, 2])
    assert rests == [0.5, 0.5]


def test_the_purge_stops_at_its_budget_and_the_next_call_goes_on(rel: Reliability) -> None:
    _old_logs(rel, 12)
    week = dt.timedelta(days=7)
    rests: list[float] = []
    first = purge_logs(
        rel.engine, now=T0, retention=week, batch=5, budget_s=1.0, rest=rests.append, timer=Ticks()
    )
    assert (first, rests) == (5, [])  # the budget is checked before resting
    assert purge_logs(rel.engine, now=T0, retention=week, batch=5, rest=rests.append, timer=Ticks()) == 7


def test_settling_walks_every_pending_stub_a_slice_at_a_time_and_starts_over(rel: Reliability) -> None:
    # s1, s3, s5: every group confirmed but the stub left PENDING (two last confirms at the same instant);
    # s2, s4: one group still owes them. All share resend_at: the walk orders by message id inside it.
    for i in range(1, 6):
        add_stub(rel, f"s{i}", groups=["billing", "audit"])
        for group in ("billing", "audit") if i % 2 else ("billing",):
            set_inbox(rel, f"s{i}", group, status=StubStatus.CONFIRMED)
    with rel.engine.begin() as conn:  # the producer's send failed: each stub shows why
        conn.execute(text("UPDATE message_stub SET last_error = 'ConnectionError: broker down'"))
    cursors = []
    with rel.engine.begin() as conn:
        cursor = outbox.settle_slice(conn, T0, None, 2)
        cursors.append(cursor)
    assert [get_stub(rel, f"s{i}").status for i in (1, 3, 5)] == [StubStatus.CONFIRMED] + [
        StubStatus.PENDING
    ] * 2
    while cursor is not None:
        with rel.engine.begin() as conn:
            cursor = outbox.settle_slice(conn, T0, cursor, 2)
            cursors.append(cursor)
    assert [c[1] if c else None for c in cursors] == ["s2", "s4", None]  # s5 and the end: start over
    assert [get_stub(rel, f"s{i}").status for i in range(1, 6)] == [
        StubStatus.CONFIRMED,
        StubStatus.PENDING,
        StubStatus.CONFIRMED,
        StubStatus.PENDING,
        StubStatus.CONFIRMED,
    ]
    # a settled stub no longer shows its failed send; an open one still does
    assert [get_stub(rel, f"s{i}").last_error is None for i in range(1, 6)] == [
        True,
        False,
        True,
        False,
        True,
    ]
