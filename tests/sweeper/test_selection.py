"""The selection statement, condition by condition and all together, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reliable import Reliability
from reliable.sweeper.selection import Budget, due_statement
from reliable.types import StubStatus
from tests.sweeper.helpers import T0, add_log, add_stub, clean, set_progress

MAX_SENDS = 3
STUCK = dt.timedelta(minutes=10)
AGO = lambda s: T0 - dt.timedelta(seconds=s)  # noqa: E731


@dataclass
class Case:
    stub: dict[str, Any]
    expected: bool
    #: (received seconds ago, extra fields) per log row
    logs: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    #: (max_offset, extra fields) per consume_progress row
    progress: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    stuck: bool = False


CASES: dict[str, Case] = {
    # --- the five seed conditions, each flipped on its own -------------------------------------------------
    "due-no-offset": Case({}, True),
    "confirmed": Case({"status": StubStatus.CONFIRMED}, False),
    "voided": Case({"status": StubStatus.VOIDED}, False),
    "dead": Case({"status": StubStatus.DEAD}, False),
    "budget-spent": Case({"send_count": MAX_SENDS}, False),
    "budget-last-try": Case({"send_count": MAX_SENDS - 1}, True),
    "not-yet-due": Case({"resend_at": T0 + dt.timedelta(seconds=1)}, False),
    "due-exactly-now": Case({"resend_at": T0}, True),
    "resend-at-null": Case({"resend_at": None}, False),
    "logged-recently": Case({}, False, logs=[(5, {})]),
    # --- offsets against the watermark of the same group/topic/queue ---------------------------------------
    "offset-below-watermark": Case({"queue_offset": 7}, True, progress=[(9, {})]),
    "offset-at-watermark": Case({"queue_offset": 9}, True, progress=[(9, {})]),
    "offset-above-watermark": Case({"queue_offset": 10}, False, progress=[(9, {})]),
    "offset-no-progress-row": Case({"queue_offset": 0}, False),
    "watermark-of-other-queue": Case(
        {"queue_offset": 5, "queue_id": 2}, False, progress=[(99, {"queue_id": 1})]
    ),
    "watermark-of-own-queue-among-others": Case(
        {"queue_offset": 5, "queue_id": 2}, True, progress=[(99, {"queue_id": 1}), (6, {"queue_id": 2})]
    ),
    "watermark-high-elsewhere-low-here": Case(
        {"queue_offset": 50, "queue_id": 3}, False, progress=[(900, {"queue_id": 0}), (10, {"queue_id": 3})]
    ),
    "watermark-of-other-group": Case({"queue_offset": 5}, False, progress=[(99, {"group": "audit"})]),
    "watermark-of-other-topic": Case({"queue_offset": 5}, False, progress=[(99, {"topic": "invoices"})]),
    # --- logged by someone else is not logged -------------------------------------------------------------
    "logged-by-other-group": Case({}, True, logs=[(5, {"consumer_group": "audit"})]),
    # --- stuck ----------------------------------------------------------------------------------------------
    "stuck-old-delivery": Case({"queue_offset": 3}, True, logs=[(3600, {})], progress=[(3, {})], stuck=True),
    "stuck-newest-is-recent": Case({}, False, logs=[(3600, {}), (60, {})]),
    "stuck-just-inside-window": Case({}, False, logs=[(STUCK.total_seconds() - 1, {})]),
    "stuck-but-not-due": Case({"resend_at": T0 + dt.timedelta(minutes=1)}, False, logs=[(3600, {})]),
    "stuck-but-budget-spent": Case({"send_count": MAX_SENDS}, False, logs=[(3600, {})]),
    "stuck-but-confirmed": Case({"status": StubStatus.CONFIRMED}, False, logs=[(3600, {})]),
    # a stuck stub is re-sent whatever its offset: it was received, the watermark question is answered
    "stuck-offset-above-watermark": Case(
        {"queue_offset": 50}, True, logs=[(3600, {})], progress=[(9, {})], stuck=True
    ),
}


def build(rel: Reliability, name: str, case: Case) -> None:
    add_stub(rel, name, **case.stub)
    for ago, extra in case.logs:
        add_log(rel, name, AGO(ago), **extra)
    for max_offset, extra in case.progress:
        group = extra.get("group", "billing")
        topic = extra.get("topic", "orders")
        queue_id = extra.get("queue_id", 0)
        # one progress row per (group, topic, queue) is shared by all cases: keep the world consistent by
        # giving each case its own group when it brings progress rows
        set_progress(rel, max_offset, group=f"{group}-{name}", topic=topic, queue_id=queue_id)


def selected(rel: Reliability, budget: Budget = Budget.RESEND) -> dict[str, bool]:
    stmt = due_statement(now=T0, stuck_after=STUCK, max_sends=MAX_SENDS, limit=1000, budget=budget)
    with rel.engine.connect() as conn:
        return {r.message_id: r.last_received_at is not None for r in conn.execute(stmt)}


def _own_groups(name: str, case: Case) -> Case:
    """Each case gets its own consumer group, so all cases can live in one database at once."""
    stub = {"consumer_group": f"billing-{name}", **case.stub}
    logs = [
        (ago, {**extra, "consumer_group": f"{extra.get('consumer_group', 'billing')}-{name}"})
        for ago, extra in case.logs
    ]
    return Case(stub, case.expected, logs, case.progress, case.stuck)


@pytest.mark.parametrize("name", list(CASES))
def test_each_condition_on_its_own(rel: Reliability, name: str) -> None:
    build(rel, name, _own_groups(name, CASES[name]))
    got = selected(rel)
    case = CASES[name]
    assert (name in got) is case.expected
    if case.expected:
        assert got[name] is case.stuck


def test_all_conditions_together_in_one_database(rel: Reliability) -> None:
    for name, case in CASES.items():
        build(rel, name, _own_groups(name, case))
    got = selected(rel)
    assert set(got) == {n for n, c in CASES.items() if c.expected}
    assert {n for n, stuck in got.items() if stuck} == {n for n, c in CASES.items() if c.expected and c.stuck}


def test_exhausted_budget_statement_selects_what_would_be_resent_but_cannot(rel: Reliability) -> None:
    add_stub(rel, "spent-lost", send_count=MAX_SENDS, queue_offset=4)
    add_stub(rel, "spent-queued", send_count=MAX_SENDS, queue_offset=40)
    add_stub(rel, "spent-stuck", send_count=MAX_SENDS + 2)
    add_log(rel, "spent-stuck", AGO(3600))
    add_stub(rel, "spent-working", send_count=MAX_SENDS)
    add_log(rel, "spent-working", AGO(5))
    add_stub(rel, "has-budget", send_count=1)
    set_progress(rel, 10)
    assert selected(rel, Budget.EXHAUSTED) == {"spent-lost": False, "spent-stuck": True}
    assert selected(rel) == {"has-budget": False}


def test_batch_limit_and_order_oldest_due_first(rel: Reliability) -> None:
    for i in range(7):
        add_stub(rel, f"m{i}", resend_at=AGO(100 - i))
    stmt = due_statement(now=T0, stuck_after=STUCK, max_sends=MAX_SENDS, limit=3)
    with rel.engine.connect() as conn:
        assert [r.message_id for r in conn.execute(stmt)] == ["m0", "m1", "m2"]


# --- property: the SQL agrees with a plain-Python reading of DESIGN.md §3 --------------------------------
stub_st = st.fixed_dictionaries(
    {
        # biased towards the interesting case: PENDING and due
        "status": st.sampled_from([StubStatus.PENDING] * 3 + list(StubStatus)),
        "send_count": st.integers(0, MAX_SENDS + 1),
        "resend_in": st.one_of(st.none(), st.integers(-3, 1)),
        "queue_id": st.integers(0, 1),
        "queue_offset": st.one_of(st.none(), st.integers(0, 3)),
        "group": st.sampled_from(["g1", "g2"]),
        # (seconds ago, group) of each delivery
        "logs": st.lists(st.tuples(st.sampled_from([5, 900]), st.sampled_from(["g1", "g2"])), max_size=2),
    }
)
world_st = st.tuples(
    st.lists(stub_st, min_size=1, max_size=8),
    st.fixed_dictionaries(
        {(g, q): st.one_of(st.none(), st.integers(0, 3)) for g in ("g1", "g2") for q in (0, 1)}
    ).map(lambda d: {k: v for k, v in d.items() if v is not None}),
)


def oracle(stub: dict[str, Any], progress: dict[tuple[str, int], int]) -> bool:
    """DESIGN.md §3, written out without SQL (with the ``<=`` decision of selection.py)."""
    if stub["status"] is not StubStatus.PENDING or stub["send_count"] >= MAX_SENDS:
        return False
    if stub["resend_in"] is None or stub["resend_in"] > 0:
        return False
    own = [ago for ago, group in stub["logs"] if group == stub["group"]]
    if own:
        return min(own) > STUCK.total_seconds()  # newest delivery older than stuck_after
    watermark = progress.get((stub["group"], stub["queue_id"]))
    return stub["queue_offset"] is None or (watermark is not None and stub["queue_offset"] <= watermark)


@pytest.fixture
def sqlite_rel(sqlite_url: str) -> Iterator[Reliability]:
    """SQLite only: the property runs many small worlds; the table tests above cover every backend."""
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    r = Reliability(sqlite_url, redis_url="")
    yield r
    r.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=world_st)
def test_selection_matches_the_rules_on_random_worlds(sqlite_rel: Reliability, world: Any) -> None:
    stubs, progress = world
    r = sqlite_rel
    clean(r.engine)
    for i, s in enumerate(stubs):
        resend = None if s["resend_in"] is None else T0 + dt.timedelta(seconds=s["resend_in"])
        add_stub(
            r,
            f"p{i}",
            status=s["status"],
            send_count=s["send_count"],
            resend_at=resend,
            queue_id=s["queue_id"],
            queue_offset=s["queue_offset"],
            consumer_group=s["group"],
        )
        for ago, group in s["logs"]:
            add_log(r, f"p{i}", AGO(ago), consumer_group=group)
    for (group, queue_id), max_offset in progress.items():
        set_progress(r, max_offset, group=group, queue_id=queue_id)
    expected = {f"p{i}" for i, s in enumerate(stubs) if oracle(s, progress)}
    assert set(selected(r)) == expected
