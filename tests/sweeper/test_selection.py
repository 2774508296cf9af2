"""Which inbox rows the sweeper looks at, per (group, message), on SQLite, PostgreSQL and MariaDB.

The statement selects every due, unconfirmed row of a group that never received the message or holds a stale
delivery; whether such a row is lost or merely queued is the verdict's business (test_verdict.py). What a
user needs from the statement: a group's row is never hidden by another group's state, a row the guard gave
up on (DEAD at ``max_attempts``) never comes back, a stray body dead-lettered under a staged id does not hide
the staged message, and rows not due stay out of the batch.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pytest

from reliable import Reliability
from reliable.sweeper.selection import Budget, due_statement
from reliable.types import LogOutcome, StubStatus
from tests.sweeper.helpers import T0, add_log, add_stub, set_inbox

MAX_SENDS = 3
STUCK = dt.timedelta(minutes=10)


def ago(seconds: float) -> dt.datetime:
    return T0 - dt.timedelta(seconds=seconds)


@dataclass
class Case:
    stub: dict[str, Any]
    #: the (group) rows expected in the batch, with whether each is stuck
    expected: dict[str, bool]
    groups: tuple[str, ...] = ("billing",)
    #: (group, received seconds ago, extra log fields) per delivery
    logs: list[tuple[str, float, dict[str, Any]]] = field(default_factory=list)
    #: per-group inbox changes
    inbox: dict[str, dict[str, Any]] = field(default_factory=dict)


DL = {"outcome": LogOutcome.DEAD_LETTER}
CASES: dict[str, Case] = {
    "never-received": Case({}, {"billing": False}),
    "never-sent": Case({"queue_offset": None}, {"billing": False}),
    "confirmed": Case({"status": StubStatus.CONFIRMED}, {}),
    "voided": Case({"status": StubStatus.VOIDED}, {}),
    "dead": Case({"status": StubStatus.DEAD}, {}),
    "budget-last-try": Case({"send_count": MAX_SENDS - 1}, {"billing": False}),
    "budget-spent": Case({"send_count": MAX_SENDS}, {}),
    "not-yet-due": Case({"resend_at": T0 + dt.timedelta(seconds=1)}, {}),
    "due-exactly-now": Case({"resend_at": T0}, {"billing": False}),
    "resend-at-null": Case({"resend_at": None}, {}),
    "received-recently": Case({}, {}, logs=[("billing", 5, {})]),
    "stuck": Case({}, {"billing": True}, logs=[("billing", 3600, {})]),
    "stuck-newest-recent": Case({}, {}, logs=[("billing", 3600, {}), ("billing", 60, {})]),
    "stuck-just-inside-window": Case({}, {}, logs=[("billing", STUCK.total_seconds() - 1, {})]),
    # the guard gave up on it (its handler failed max_attempts times): DEAD, re-sending cannot help
    "guard-gave-up": Case(
        {"status": StubStatus.DEAD}, {}, logs=[("billing", 3600, {**DL, "reason": "max_attempts: 16/16"})]
    ),
    # a stray body under the staged id was dead-lettered; the staged body never arrived: stuck, re-sent
    "stray-body-dead-lettered": Case(
        {}, {"billing": True}, logs=[("billing", 3600, {**DL, "reason": "payload_mismatch: sha256 differs"})]
    ),
    # --- fan-out: each group's row stands on its own -----------------------------------------------------
    "received-by-other-group-only": Case(
        {}, {"audit": False}, groups=("billing", "audit"), logs=[("billing", 5, {})]
    ),
    "confirmed-by-one-group": Case(
        {}, {"audit": False}, groups=("billing", "audit"), inbox={"billing": {"status": StubStatus.CONFIRMED}}
    ),
    "other-group-gave-up": Case(
        {},
        {"audit": True},
        groups=("billing", "audit"),
        logs=[("billing", 3600, DL), ("audit", 3600, {})],
        inbox={"billing": {"status": StubStatus.DEAD}},
    ),
    "spent-for-one-group": Case(
        {}, {"audit": False}, groups=("billing", "audit"), inbox={"billing": {"resend_count": MAX_SENDS}}
    ),
}


def build(rel: Reliability, name: str, case: Case) -> None:
    add_stub(rel, name, groups=case.groups, **{"queue_offset": 5, **case.stub})
    for group, changes in case.inbox.items():
        set_inbox(rel, name, group, **changes)
    for group, seconds, extra in case.logs:
        add_log(rel, name, ago(seconds), consumer_group=group, **extra)


def selected(
    rel: Reliability, budget: Budget = Budget.RESEND, limit: int = 1000
) -> dict[tuple[str, str], bool]:
    stmt = due_statement(
        now=T0,
        stuck_after=STUCK,
        max_sends=MAX_SENDS,
        limit=limit,
        budget=budget,
        dialect=rel.engine.dialect.name,
    )
    with rel.engine.connect() as conn:
        return {(r.message_id, r.consumer_group): r.last_received_at is not None for r in conn.execute(stmt)}


@pytest.mark.parametrize("name", list(CASES))
def test_each_condition_on_its_own(rel: Reliability, name: str) -> None:
    build(rel, name, CASES[name])
    assert selected(rel) == {(name, g): stuck for g, stuck in CASES[name].expected.items()}


def test_all_conditions_together_in_one_database(rel: Reliability) -> None:
    for name, case in CASES.items():
        build(rel, name, case)
    expected = {(n, g): stuck for n, c in CASES.items() for g, stuck in c.expected.items()}
    assert selected(rel) == expected


def test_any_budget_also_returns_spent_rows_to_give_up(rel: Reliability) -> None:
    add_stub(rel, "spent", send_count=MAX_SENDS, queue_offset=4)
    add_stub(rel, "spent-stuck", send_count=MAX_SENDS + 2)
    add_log(rel, "spent-stuck", ago(3600))
    add_stub(rel, "spent-working", send_count=MAX_SENDS)
    add_log(rel, "spent-working", ago(5))
    add_stub(rel, "has-budget", send_count=1)
    assert selected(rel, Budget.ANY) == {
        ("spent", "billing"): False,
        ("spent-stuck", "billing"): True,
        ("has-budget", "billing"): False,
    }
    assert selected(rel) == {("has-budget", "billing"): False}


def test_newest_delivery_facts_come_with_a_stuck_row(rel: Reliability) -> None:
    """The broker's retry schedule needs the newest delivery's reconsume_times and outcome."""
    add_stub(rel, "retried")
    add_log(rel, "retried", ago(7200), reconsume_times=0, outcome=LogOutcome.RETRY)
    add_log(rel, "retried", ago(3600), reconsume_times=4, outcome=LogOutcome.RETRY)
    stmt = due_statement(
        now=T0, stuck_after=STUCK, max_sends=MAX_SENDS, limit=10, dialect=rel.engine.dialect.name
    )
    with rel.engine.connect() as conn:
        [row] = conn.execute(stmt).all()
    assert (row.last_reconsume_times, LogOutcome(row.last_outcome)) == (4, LogOutcome.RETRY)


def test_each_dialect_shape_selects_what_the_portable_shape_selects(rel: Reliability) -> None:
    """PostgreSQL reads the newest delivery through a LATERAL join and SQLite/PostgreSQL join the stub; the
    portable statement (MariaDB/MySQL's) must give the same rows with the same newest-delivery facts."""
    for name, case in CASES.items():
        build(rel, name, case)
    add_stub(rel, "retried")  # deliveries received at the same instant: the later id is the newest
    add_log(rel, "retried", ago(7200), reconsume_times=0, outcome=LogOutcome.RETRY)
    add_log(rel, "retried", ago(3600), reconsume_times=3, outcome=LogOutcome.RETRY)
    add_log(rel, "retried", ago(3600), reconsume_times=4, outcome=LogOutcome.SUCCESS)

    def rows(dialect: str) -> list[tuple[Any, ...]]:
        stmt = due_statement(now=T0, stuck_after=STUCK, max_sends=MAX_SENDS, limit=1000, dialect=dialect)
        with rel.engine.connect() as conn:
            found = conn.execute(stmt).all()
        return sorted(
            (r.message_id, r.consumer_group, r.last_received_at, r.last_reconsume_times, r.last_outcome)
            for r in found
        )

    portable = rows("")
    expected = {(n, g) for n, c in CASES.items() for g in c.expected} | {("retried", "billing")}
    assert {(m, g) for m, g, *_ in portable} == expected
    assert ("retried", "billing", ago(3600), 4, LogOutcome.SUCCESS) in portable
    assert rows(rel.engine.dialect.name) == portable


def test_batch_limit_and_order_oldest_due_first(rel: Reliability) -> None:
    for i in range(7):
        add_stub(rel, f"m{i}", resend_at=ago(100 - i))
    stmt = due_statement(now=T0, stuck_after=STUCK, max_sends=MAX_SENDS, limit=3)
    with rel.engine.connect() as conn:
        assert [r.message_id for r in conn.execute(stmt)] == ["m0", "m1", "m2"]
