"""The demo's own building blocks: the ledger invariant, the audit groups, the chaos schedule, the per-group
counters and duplicate attribution."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, insert, update

from reliable.demo import audit, chaos, groups, ledger, stats
from reliable.demo.errors import BadOrderError
from reliable.facade import make_engine
from reliable.migrate import upgrade
from reliable.models import MessageInbox, MessageLog, MessageStub, utcnow
from reliable.sweeper.selection import inbox, log, stub
from reliable.types import Envelope


@pytest.fixture
def engine(sqlite_url: str) -> Iterator[Engine]:
    eng = make_engine(sqlite_url)
    upgrade(eng)
    with eng.begin() as conn:
        for table in (log, inbox, stub):
            conn.execute(table.delete())
    yield eng
    eng.dispose()


def _apply(engine, orders: list[ledger.Order]) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy.orm import Session

    with Session(engine) as s, s.begin():
        for o in orders:
            ledger.apply_order(s, o, "test")


def test_ledger_balances_when_each_order_applied_once(engine) -> None:  # type: ignore[no-untyped-def]
    ledger.reset(engine, 10)
    orders = ledger.make_orders("run", 200, 10, seed=3)
    _apply(engine, orders)
    check = ledger.check(engine, [o.order_id for o in orders], 10)
    assert check.ok
    assert check.applied == 200 and check.lost == 0 and check.double_applied == 0
    assert check.total_actual == check.total_expected == 10 * ledger.OPENING_BALANCE


def test_ledger_detects_lost_and_double_applied(engine) -> None:  # type: ignore[no-untyped-def]
    ledger.reset(engine, 5)
    orders = ledger.make_orders("run", 20, 5, seed=1)
    _apply(engine, orders[:19])  # the last one is lost
    _apply(engine, [orders[0]])  # the first one twice
    check = ledger.check(engine, [o.order_id for o in orders], 5)
    assert not check.ok
    assert check.lost_ids == (orders[19].order_id,)
    assert check.double_applied_ids == (orders[0].order_id,)
    # a double application moves money twice but still conserves the total: the ledger count catches it
    assert check.total_actual == check.total_expected


def test_ledger_detects_a_balance_written_outside_the_ledger(engine) -> None:  # type: ignore[no-untyped-def]
    ledger.reset(engine, 3)
    with engine.begin() as conn:
        conn.execute(update(ledger.accounts).where(ledger.accounts.c.account_id == 1).values(balance=5))
    check = ledger.check(engine, [], 3)
    assert not check.ok and not check.accounts_consistent


def test_reset_only_touches_the_demo_tables(engine) -> None:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        conn.execute(
            insert(MessageLog).values(
                message_id="keep",
                consumer_group="g",
                topic="t",
                queue_id=0,
                queue_offset=0,
                received_at=utcnow(),
            )
        )
    ledger.reset(engine, 2)
    with engine.connect() as conn:
        assert conn.execute(MessageLog.__table__.select()).all()


@pytest.mark.parametrize("body", [b"", b"{}", b"not json", b'{"order_id":"a","src":1,"dst":1,"amount":5}'])
def test_bad_order_bodies_raise_a_typed_error(body: bytes) -> None:
    with pytest.raises(BadOrderError):
        ledger.Order.from_body(body)


def test_business_handler_parses_and_applies(engine) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy.orm import Session

    ledger.reset(engine, 2)
    order = ledger.Order("o-1", 0, 1, 7)
    handler = ledger.make_business_handler("w")
    with Session(engine) as s, s.begin():
        handler(Envelope("o-1", "T", 0, 0, order.to_body()), s)
    assert ledger.check(engine, ["o-1"], 2).ok


@given(st.integers(min_value=0, max_value=10_000))
@settings(max_examples=60, deadline=None)
def test_chaos_plan_is_deterministic_and_well_formed(seed: int) -> None:
    a, b = chaos.plan(seed), chaos.plan(seed)
    assert a == b
    assert {f.kind for f in a} == chaos.SINGLE_BROKER  # every kind of one broker at least once
    assert [f.at for f in a] == sorted(f.at for f in a)
    for f in a:
        assert 0.05 <= f.at <= 0.9
        if f.kind is chaos.FaultKind.BROKER_CRASH:
            assert f.at <= 0.7
    # a cluster: a group's master (and, with slaves, a slave) dies instead of the whole broker, early
    # enough that later sends pass whatever it lost
    kinds = chaos.kinds_for(brokers=2, slaves=1)
    on_cluster = chaos.plan(seed, kinds)
    assert {f.kind for f in on_cluster} == kinds
    assert chaos.FaultKind.BROKER_CRASH not in kinds
    assert {chaos.FaultKind.MASTER_LOSS, chaos.FaultKind.SLAVE_LOSS} <= kinds
    for f in on_cluster:
        if f.kind in chaos.CLUSTER_ONLY:
            assert f.at <= 0.7 and 2000 <= f.param <= 4000
    assert chaos.FaultKind.SLAVE_LOSS not in chaos.kinds_for(brokers=2, slaves=0)
    assert chaos.kinds_for(brokers=1, slaves=0) == chaos.SINGLE_BROKER


def test_chaos_plans_differ_between_seeds() -> None:
    assert chaos.plan(1) != chaos.plan(2)


@dataclasses.dataclass
class _Target:
    calls: list[str] = dataclasses.field(default_factory=list)

    def lose_send_acks(self, count: int) -> str:
        self.calls.append("acks")
        return "ok"

    def kill_consumer(self, slot: int) -> str:
        self.calls.append("kill")
        return "ok"

    def crash_broker(self, down_ms: int) -> str:
        raise chaos.FaultUnsupported("not here")

    def lose_offset_commits(self, slot: int) -> str:
        return "ok"

    def rebalance_storm(self, joiners: int) -> str:
        return "ok"

    def redis_flushall(self) -> str:
        return "ok"

    def redis_down(self, down_ms: int) -> str:
        raise RuntimeError("boom")

    def drop_db_connections(self) -> str:
        return "ok"

    def lose_master(self, down_ms: int) -> str:
        self.calls.append("master")
        return "ok"

    def lose_slave(self, down_ms: int) -> str:
        raise chaos.FaultUnsupported("no slave")


def test_controller_records_injected_skipped_and_failed_faults() -> None:
    target = _Target()
    schedule = [
        chaos.PlannedFault(0.1, chaos.FaultKind.LOST_SEND_ACK, 3),
        chaos.PlannedFault(0.2, chaos.FaultKind.BROKER_CRASH, 100),
        chaos.PlannedFault(0.3, chaos.FaultKind.REDIS_DOWN, 100),
        chaos.PlannedFault(0.4, chaos.FaultKind.CONSUMER_KILL, 0),
        chaos.PlannedFault(0.5, chaos.FaultKind.MASTER_LOSS, 2000),
        chaos.PlannedFault(0.6, chaos.FaultKind.SLAVE_LOSS, 2000),
    ]
    ctl = chaos.ChaosController(list(schedule), target, produced=lambda: 1.0, applied=lambda: 0.0)
    ctl.finish()  # nothing started: finish fires everything in order
    kinds = [(r.kind, r.injected) for r in ctl.records]
    assert kinds == [
        (chaos.FaultKind.LOST_SEND_ACK, True),
        (chaos.FaultKind.BROKER_CRASH, False),
        (chaos.FaultKind.REDIS_DOWN, False),
        (chaos.FaultKind.CONSUMER_KILL, True),
        (chaos.FaultKind.MASTER_LOSS, True),
        (chaos.FaultKind.SLAVE_LOSS, False),
    ]
    assert target.calls == ["acks", "kill", "master"]
    assert ctl.records[1].detail.startswith("skipped") and ctl.records[2].detail.startswith("failed")


def _log(engine, group: str, mid: str, pos: tuple[str, int, int], rt: int = 0) -> None:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        conn.execute(
            insert(MessageLog).values(
                message_id=mid,
                consumer_group=group,
                topic=pos[0],
                original_topic="T",
                queue_id=pos[1],
                queue_offset=pos[2],
                reconsume_times=rt,
                received_at=utcnow(),
            )
        )


def test_duplicate_causes_per_group(engine) -> None:  # type: ignore[no-untyped-def]
    _log(engine, "g", "a", ("T", 0, 10))
    _log(engine, "g", "a", ("T", 0, 10))  # same position again: redelivery
    _log(engine, "g", "b", ("T", 1, 5))
    _log(engine, "g", "b", ("%RETRY%g", 0, 0), rt=1)  # came back through %RETRY%g: the broker's retry
    _log(engine, "g", "c", ("T", 2, 7))
    _log(engine, "g", "c", ("T", 3, 9))  # a second copy at a new offset: double send
    _log(engine, "g", "d", ("T", 2, 8))  # delivered once to g …
    _log(engine, "h", "d", ("T", 2, 8))  # … and once to h: fan-out, not a duplicate
    _log(engine, "h", "d", ("%RETRY%h", 0, 3))  # the sweeper's resend to h alone
    _log(engine, "h", "e", ("%RETRY%h", 0, 4))  # the resend overtook the original …
    _log(engine, "h", "e", ("T", 1, 6))  # … which came after: the resend's duplicate, not a double send
    causes = stats.duplicate_causes(engine, "T")
    assert causes == {
        "g": {"redelivery": 1, "retry": 1, "producer_double_send": 1, "targeted_resend": 0},
        "h": {"redelivery": 0, "retry": 0, "producer_double_send": 0, "targeted_resend": 2},
    }
    snap = stats.snapshot(engine, "T")
    assert snap.group("g").deliveries == 7 and snap.group("g").duplicates_delivered == 3
    assert snap.group("h").deliveries == 4 and snap.group("h").duplicates_delivered == 2
    assert snap.deliveries == 11 and snap.duplicates_delivered == 5


def test_snapshot_counts_each_groups_inbox_rows(engine) -> None:  # type: ignore[no-untyped-def]
    now = utcnow()
    with engine.begin() as conn:
        for mid in ("m1", "m2"):
            conn.execute(
                insert(MessageStub).values(
                    message_id=mid, topic="T", content=b"{}", status="PENDING", send_count=2,
                    created_at=now, updated_at=now,
                )
            )  # fmt: skip
        conn.execute(
            insert(MessageInbox),
            [
                {"consumer_group": "ledger", "message_id": "m1", "status": "CONFIRMED"},
                {"consumer_group": "ledger", "message_id": "m2", "status": "DEAD"},
                {"consumer_group": "audit", "message_id": "m1", "status": "CONFIRMED"},
                {"consumer_group": "audit", "message_id": "m2", "status": "PENDING"},
            ],
        )
    snap = stats.snapshot(engine, "T")
    assert (snap.messages, snap.resent) == (2, 2)
    assert (snap.group("ledger").confirmed, snap.group("ledger").dead) == (1, 1)
    assert (snap.group("audit").confirmed, snap.group("audit").pending) == (1, 1)
    assert (snap.settled, snap.confirmed, snap.pending, snap.dead) == (3, 2, 1, 1)


def test_group_names_start_with_the_ledger_group() -> None:
    assert groups.group_names(1) == ["demo_ledger"]
    assert groups.group_names(3) == ["demo_ledger", "demo_audit", "demo_audit_2"]
    with pytest.raises(ValueError):
        groups.group_names(0)


def test_each_audit_group_must_apply_each_order_once(engine) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy.orm import Session

    groups.reset(engine, 3)
    orders = ledger.make_orders("run", 5, 3, seed=2)
    a1, a2 = groups.business_handler("demo_audit", "w"), groups.business_handler("demo_audit_2", "w")
    with Session(engine) as s, s.begin():
        for o in orders:
            a1(Envelope(o.order_id, "T", 0, 0, o.to_body()), s)
        for o in orders[1:]:  # audit_2 never got the first order …
            a2(Envelope(o.order_id, "T", 0, 0, o.to_body()), s)
        a2(Envelope(orders[2].order_id, "T", 0, 0, orders[2].to_body()), s)  # … and applied the third twice
    ids = [o.order_id for o in orders]
    ok = groups.check(engine, "demo_audit", ids, 3)
    assert ok.ok and ok.applied == 5
    bad = audit.check(engine, "demo_audit_2", ids)
    assert not bad.ok
    assert bad.lost_ids == (orders[0].order_id,) and bad.double_applied_ids == (orders[2].order_id,)
    # the ledger group is judged by the ledger, not by audit rows
    assert groups.check(engine, "demo_ledger", ids, 3).lost == 5


def test_summary_is_ok_only_when_every_group_is() -> None:
    from reliable.demo.summary import DemoSummary, GroupResult

    s = DemoSummary(messages=3, produced=3, settled=True, ledger_ok=True)
    good = GroupResult(confirmed=3, applied=3, check_ok=True, duplicate_causes={"retry": 1})
    s.set_groups({"demo_ledger": good, "demo_audit": dataclasses.replace(good)})
    assert s.ok and s.confirmed == 6 and s.duplicate_causes == {"retry": 2}
    s.set_groups({"demo_ledger": good, "demo_audit": dataclasses.replace(good, lost=1, lost_ids=["o-1"])})
    assert not s.ok and s.lost == 1 and s.lost_ids == ["demo_audit:o-1"]
    assert s.to_dict()["groups"]["demo_audit"]["ok"] is False


def test_a_new_run_clears_the_positions_of_every_earlier_demo_group(engine) -> None:  # type: ignore[no-untyped-def]
    """A --groups 3 run left demo_audit_2's position on its %RETRY% topic; every later two-group report listed
    that group with no rows. Another application's positions stay."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from reliable.demo.database import clear_previous_run
    from reliable.models import ConsumeProgress

    topics = [
        "DemoOrders",
        "%RETRY%demo_ledger",
        "%RETRY%demo_audit",
        "%RETRY%demo_audit_2",
        "%RETRY%billing",
    ]
    with engine.begin() as conn:
        for i, t in enumerate(topics):
            group = t.removeprefix("%RETRY%") if t.startswith("%RETRY%") else "demo_ledger"
            conn.execute(
                insert(ConsumeProgress).values(
                    consumer_group=group,
                    topic=t,
                    broker_name="",
                    queue_id=0,
                    min_offset=i,
                    max_offset=i,
                    updated_at=utcnow(),
                )
            )
    with Session(engine) as s, s.begin():
        clear_previous_run(s, "DemoOrders", groups.group_names(2))
    with engine.connect() as conn:
        left = set(conn.execute(select(ConsumeProgress.topic)).scalars())
    assert left & set(topics) == {"%RETRY%billing"}  # (other tests' rows of the shared database aside)
