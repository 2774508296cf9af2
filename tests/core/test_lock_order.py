"""Concurrent deliveries on PostgreSQL and MariaDB must not deadlock on the guard's own locks, and a failure
counted while another worker applies the same message must read that worker's commit.

Every step takes its row locks in message id order; where a database still picks a victim (two passes of
one transaction, the handler's own writes) the guard's transaction — rolled back in full — runs again at once
instead of answering "database unavailable". These tests build the interleavings users hit with batches and
fan-out (several groups confirming one batch at the same moment; twin deliveries of a message no producer
staged) and count the deadlocks the guard had to retry: zero, unless a test makes one on purpose.
"""

from __future__ import annotations

import datetime as dt
import functools
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from reliable import Envelope, Reason, Reliability, StubProducer, idempotent_consumer
from reliable.guard.decision import Decision, GuardHooks
from reliable.stores import InboxRow
from reliable.stores.sql import SqlStore
from tests.conftest import _ensure_clean_schema
from tests.core.guard_helpers import applied, apply, env, make_rel
from tests.core.producer.support import RecordingSender
from tests.lock_waits import (
    HoldAfterDeadlock,
    ThreadSessions,
    pg_blocked_by,
    pg_checks_for_deadlocks_last,
    session_id,
)
from tests.waiting import wait_until


@pytest.fixture
def rel(server_url: str) -> Iterator[Reliability]:
    r = make_rel(server_url, None, "lo")  # no Redis: the database alone decides, as when Redis is down
    yield r
    r.close()


def deadlocks_retried(registry: CollectorRegistry, group: str) -> float:
    value = registry.get_sample_value(
        "reliable_database_errors_total", {"group": group, "step": "deadlock_retried"}
    )
    return value or 0.0


def in_thread(target: Callable[[], Any], name: str) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = target()
        except BaseException as exc:  # the test reads it: an exception out of the guard is a defect
            out["error"] = exc

    t = threading.Thread(target=run, name=name)
    t.start()
    return t, out


def test_a_failure_counted_after_another_worker_committed_the_row_reads_that_commit(rel: Reliability) -> None:
    """W1 counts the failures of its batch [a, b] in one transaction; between its count of a and of b,
    another worker commits b as applied. On MariaDB (REPEATABLE READ) W1's read of b used the snapshot of its
    first read, where b did not exist: a KeyError escaped ``decide_batch`` (no failure counted, the leases
    never released) — or, with a producer row, the stale PENDING row made W1 answer "failed" for a message
    the other worker had applied. The count must see b as confirmed: nothing to count."""
    store = SqlStore(rel.engine)
    now = dt.datetime.now(dt.UTC)
    tag = uuid.uuid4().hex[:6]
    a, b = InboxRow(f"a-{tag}", None), InboxRow(f"b-{tag}", None)
    with rel.engine.connect() as w1, w1.begin():
        assert store.record_failure(w1, "late", a, now, "RuntimeError()") == 1  # its read: the snapshot
        with rel.engine.connect() as w2, w2.begin():  # the other worker applies b and commits
            assert store.claim_inbox(w2, "late", [b], now) == {b.message_id}
        assert store.record_failure(w1, "late", b, now, "RuntimeError()") is None


def test_groups_confirming_the_same_batch_at_once_do_not_deadlock(rel: Reliability) -> None:
    """Three groups handle the same batch of 16 staged messages and reach their confirm at the same moment
    (Kafka batches by partition, so every group gets the same batches). On MariaDB a group's settle locked
    the stubs it settled, then the exact step locked the open ones from the lowest id up: two groups each
    held a stub the other wanted — a deadlock in about one batch in twelve, answered "database unavailable"
    and counted as an outage."""
    groups = ["billing", "audit", "search"]
    producer = StubProducer(rel, RecordingSender())
    registry = CollectorRegistry()
    barrier = threading.Barrier(len(groups), timeout=30)
    trials, size = 20, 16
    answers: list[Decision] = []

    last = {"id": ""}

    def guard(group: str) -> Callable[[list[Envelope]], list[Decision]]:
        def handler(e: Envelope, session: Session) -> None:
            apply(e, session, note=group)
            if e.message_id == last["id"]:
                barrier.wait()  # every group's handlers are done: all confirm now

        return idempotent_consumer(rel, group=group, registry=registry)(handler).decide_batch

    decide = {g: guard(g) for g in groups}
    for trial in range(trials):
        ids = [f"t{trial:02d}-{uuid.uuid4().hex[:4]}-{i:03d}" for i in range(size)]
        with rel.session() as s:
            for mid in ids:
                producer.stage(s, mid, "orders", b"{}", groups=groups, send_on_commit=False)
        last["id"] = ids[-1]
        envs = [env(mid) for mid in ids]
        runs = [in_thread(functools.partial(decide[g], envs), g) for g in groups]
        for t, out in runs:
            t.join(60)
            assert "error" not in out, out.get("error")
            answers.extend(out["value"])
    assert {d.reason for d in answers} == {Reason.PROCESSED}
    assert sum(deadlocks_retried(registry, g) for g in groups) == 0


def test_twin_deliveries_that_lose_the_claim_of_a_row_do_not_deadlock(rel: Reliability) -> None:
    """Two batches of a group the producer did not stage both look for message m's row, find none, and
    insert it while another worker's insert of m is still uncommitted; that worker commits. On MariaDB each
    loser's ``INSERT IGNORE`` was left holding a shared lock on m's row, and the ``FOR UPDATE`` that then read
    it asked to upgrade it: each waited on the other's shared lock — a deadlock.

    The order is forced with row locks of the test's own: W2's and W3's batches are ``[m, z2]`` and
    ``[m, z3]``; they find no m and then wait for z2 / z3, which ``holder`` has locked, while ``inserter``
    inserts m; then holder commits (both go on to insert m and wait for inserter), then inserter commits."""
    registry = CollectorRegistry()
    tag = uuid.uuid4().hex[:6]
    m, z2, z3 = f"m-{tag}", f"z2-{tag}", f"z3-{tag}"
    store = SqlStore(rel.engine)
    now = dt.datetime.now(dt.UTC)
    with rel.engine.begin() as conn:  # z2, z3: rows of the group already (applied long ago)
        store.claim_inbox(conn, "late", [InboxRow(z2, None), InboxRow(z3, None)], now)
    handle = idempotent_consumer(rel, group="late", registry=registry)(apply)
    read_committed = rel.engine.execution_options(
        isolation_level="READ COMMITTED"
    )  # as the guard: no gap locks
    with read_committed.connect() as holder, read_committed.connect() as inserter:
        holder.begin()
        holder.execute(
            text(
                "SELECT 1 FROM message_inbox WHERE consumer_group = 'late' AND message_id IN (:a, :b) "
                "FOR UPDATE"
            ),
            {"a": z2, "b": z3},
        )
        batches = [
            in_thread(functools.partial(handle.decide_batch, [env(m), env(z)]), f"W{z}") for z in (z2, z3)
        ]
        wait_until(
            lambda: running(rel, "SELECT%message_inbox%FOR UPDATE%") >= 2,
            what="both batches waiting for z2 / z3",
        )
        inserter.begin()
        store.claim_inbox(inserter, "late", [InboxRow(m, None)], now)  # another worker's claim of m
        holder.commit()
        wait_until(
            lambda: running(rel, "INSERT%message_inbox%") >= 2, what="both batches inserting m, waiting"
        )
        inserter.commit()
        results: list[Decision] = []
        for t, out in batches:
            t.join(60)
            assert "error" not in out, out.get("error")
            results.extend(out["value"])
    handle.close()
    assert {(d.message_id, d.reason) for d in results} == {
        (m, Reason.DUPLICATE_CONFIRMED),
        (z2, Reason.DUPLICATE_CONFIRMED),
        (z3, Reason.DUPLICATE_CONFIRMED),
    }
    assert deadlocks_retried(registry, "late") == 0


def running(rel: Reliability, pattern: str) -> int:
    """Sessions of this database blocked for a while in a statement ``LIKE pattern`` (the server's own
    view; MariaDB may wait for a row lock while still planning a statement,
    where INNODB_TRX does not list it as waiting)."""
    if rel.engine.dialect.name == "postgresql":
        sql = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' AND query ILIKE :q"
        )
    else:
        sql = (
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() "
            "AND ID <> CONNECTION_ID() AND COMMAND = 'Query' AND TIME_MS > 100 AND INFO LIKE :q"
        )
    with rel.engine.connect() as conn:
        return int(conn.execute(text(sql), {"q": pattern}).scalar_one())


def test_a_work_transaction_chosen_as_deadlock_victim_runs_again(postgres_url: str) -> None:
    """Another transaction (an operator's script, an application's own job) locks the stub, then the
    group's inbox row the guard holds: PostgreSQL breaks the deadlock by rolling back the guard, which waited
    first. The guard's transaction had committed nothing, so it runs again at once: the message is applied
    once and answered processed — not "database unavailable" after a broker round trip."""
    _ensure_clean_schema(postgres_url)
    rel = make_rel(postgres_url, None, "lo")
    guard_sessions, hold = ThreadSessions(rel.engine, "guard"), HoldAfterDeadlock(rel.engine, "guard")
    try:
        registry = CollectorRegistry()
        mid = f"victim-{uuid.uuid4().hex[:6]}"
        StubProducer(rel, RecordingSender()).publish(mid, "orders", b"{}", groups=["billing"])

        hooks = CountingHooks()
        handle = idempotent_consumer(rel, group="billing", registry=registry, hooks=[hooks])(apply)
        with rel.engine.connect() as other:
            other.begin()
            other_pid = session_id(other)
            pg_checks_for_deadlocks_last(other)
            locked = "SELECT 1 FROM message_stub WHERE message_id = :m FOR UPDATE"
            other.execute(text(locked), {"m": mid})
            guard, out = in_thread(lambda: handle.decide(env(mid)), "guard")
            wait_until(
                lambda: pg_blocked_by(rel.engine, guard_sessions.snapshot(), [other_pid]),
                what="the guard waiting for the stub the test holds",
            )
            _lock_inbox(other, mid)  # the deadlock: PostgreSQL rolls the guard back
            hold.go.set()  # the test's transaction has the inbox row: the guard may run again
            wait_until(lambda: deadlocks_retried(registry, "billing") > 0, what="the guard's retry")
            other.commit()
        guard.join(60)
        handle.close()
        assert "error" not in out, out.get("error")
        assert out["value"].reason is Reason.PROCESSED
        assert applied(rel, mid) == 1
        assert deadlocks_retried(registry, "billing") == 1
        assert (hold.held, hold.timed_out) == (1, False)
        # the guard was rolled back while it waited for the stub, before the handler: one run, one decision
        assert hooks.calls == {"before_handler": 1, "after_handler": 1, "after_decision": 1}
    finally:
        guard_sessions.close()
        hold.close()
        rel.close()


class CountingHooks(GuardHooks):
    def __init__(self) -> None:
        self.calls: dict[str, int] = {"before_handler": 0, "after_handler": 0, "after_decision": 0}

    def before_handler(self, env: Envelope) -> None:
        self.calls["before_handler"] += 1

    def after_handler(self, env: Envelope, error: BaseException | None) -> None:
        self.calls["after_handler"] += 1

    def after_decision(self, env: Envelope, decision: Decision) -> None:
        self.calls["after_decision"] += 1


def _lock_inbox(conn: Connection, mid: str) -> None:
    conn.execute(
        text("SELECT 1 FROM message_inbox WHERE message_id = :m AND consumer_group = 'billing' FOR UPDATE"),
        {"m": mid},
    )


def test_a_deadlock_rerun_of_a_savepoint_batch_keeps_its_failed_handler_failed(postgres_url: str) -> None:
    """Batch [A, B, C]: A fails, so the rest run again with a savepoint each; B fails there (its savepoint
    rolled back), C succeeds — then the guard's last statement is chosen as a deadlock victim. The rerun
    kept B's error from the rolled-back run while B's handler, run again, succeeded: its write committed,
    B left unconfirmed and answered "failed" — and the broker's redelivery applied B a second time. B's
    failure is counted as any other; its redelivery is applied once."""
    _ensure_clean_schema(postgres_url)
    rel = make_rel(postgres_url, None, "lo")
    guard_sessions, hold = ThreadSessions(rel.engine, "guard"), HoldAfterDeadlock(rel.engine, "guard")
    try:
        registry = CollectorRegistry()
        tag = uuid.uuid4().hex[:6]
        a, b, c, warm = (f"{x}-{tag}" for x in ("a", "b", "c", "warm"))
        with StubProducer(rel, RecordingSender()).transaction() as tx:
            for mid in (a, b, c, warm):
                tx.stage(mid, "orders", b"{}", groups=["billing"])
        calls = {mid: 0 for mid in (a, b, c, warm)}
        at_c = threading.Event()

        def handler(e: Envelope, session: Session) -> None:
            assert e.message_id is not None
            calls[e.message_id] += 1
            if e.message_id in (a, b) and calls[e.message_id] == 1:
                raise RuntimeError(f"{e.message_id} fails once")
            apply(e, session)
            if e.message_id == c and calls[c] == 1:
                at_c.set()

        hooks = CountingHooks()
        handle = idempotent_consumer(rel, group="billing", registry=registry, hooks=[hooks])(handler)
        handle.decide(env(warm))  # the group's watermark row exists: the batch's last statement updates it
        with rel.engine.connect() as other:
            other.begin()
            other_pid = session_id(other)
            pg_checks_for_deadlocks_last(other)
            other.execute(text("SELECT 1 FROM consume_progress WHERE consumer_group = 'billing' FOR UPDATE"))
            batch, out = in_thread(lambda: handle.decide_batch([env(a), env(b), env(c)]), "guard")
            assert at_c.wait(30)
            wait_until(
                lambda: pg_blocked_by(rel.engine, guard_sessions.snapshot(), [other_pid]),
                what="the guard's watermark waiting for the test's lock",
            )
            _lock_inbox(other, c)  # the deadlock: PostgreSQL rolls the guard back (it waited first)
            hold.go.set()
            other.rollback()
        batch.join(60)
        assert "error" not in out, out.get("error")
        reasons = {d.message_id: d.reason for d in out["value"]}
        assert reasons == {a: Reason.HANDLER_FAILED, b: Reason.HANDLER_FAILED, c: Reason.PROCESSED}
        assert deadlocks_retried(registry, "billing") == 1
        assert (hold.held, hold.timed_out) == (1, False)
        # A's failure stopped the plain run before B and C; C ran in the savepoint pass and after the
        # deadlock. The hooks report each run of a handler (warm's too), and one decision per delivery
        assert (calls[a], calls[b], calls[c]) == (1, 1, 2)
        assert hooks.calls == {"before_handler": 5, "after_handler": 5, "after_decision": 4}
        assert applied(rel, b) == 0  # nothing of B committed: it failed
        assert handle.decide(env(b, reconsume_times=1)).reason is Reason.PROCESSED  # the redelivery
        assert applied(rel, b) == 1
        handle.close()
    finally:
        guard_sessions.close()
        hold.close()
        rel.close()


def test_a_settle_step_chosen_as_deadlock_victim_counts_each_failure_once(postgres_url: str) -> None:
    """Batch [X, Y], both handlers fail; the settle step counts the failures, X's row then Y's. Another
    transaction takes Y's row first, then X's: PostgreSQL rolls the settle back (it waited first). Its
    transaction committed nothing, so it runs again from the decisions it started with: each failure is
    counted once, each delivery journaled once, and the batch is answered "retry" — not "database
    unavailable", and not a second attempt counted for a decision the rollback undid."""
    _ensure_clean_schema(postgres_url)
    rel = make_rel(postgres_url, None, "lo")
    guard_sessions, hold = ThreadSessions(rel.engine, "guard"), HoldAfterDeadlock(rel.engine, "guard")
    try:
        registry = CollectorRegistry()
        tag = uuid.uuid4().hex[:6]
        x, y = f"x-{tag}", f"y-{tag}"
        with StubProducer(rel, RecordingSender()).transaction() as tx:
            for mid in (x, y):
                tx.stage(mid, "orders", b"{}", groups=["billing"])
        at_y, release_y, y_taken = threading.Event(), threading.Event(), threading.Event()

        def handler(e: Envelope, session: Session) -> None:
            if e.message_id == y:  # the savepoint pass: its work transaction holds Y's row (X's is free)
                at_y.set()
                assert release_y.wait(30)
            raise RuntimeError(f"{e.message_id} fails")

        def other_transaction(other: Connection, other_pid: int) -> None:
            _lock_inbox(other, y)  # granted when the work transaction ends
            y_taken.set()
            wait_until(
                lambda: pg_blocked_by(rel.engine, guard_sessions.snapshot(), [other_pid]),
                what="the settle step waiting for Y's row",
            )
            _lock_inbox(other, x)  # the deadlock: the settle holds X and waits for Y
            hold.go.set()
            other.rollback()

        handle = idempotent_consumer(rel, group="billing", registry=registry)(handler)
        with rel.engine.connect() as gate, rel.engine.connect() as other:
            gate_pid, other_pid = session_id(gate), session_id(other)
            pg_checks_for_deadlocks_last(other)
            batch, out = in_thread(lambda: handle.decide_batch([env(x), env(y)]), "guard")
            assert at_y.wait(30)
            # the gate holds X until the test holds Y: without it the settle step, which starts the moment
            # the work transaction commits, could lock Y before the test's transaction woke up to take it
            _lock_inbox(gate, x)
            taker, other_out = in_thread(functools.partial(other_transaction, other, other_pid), "other")
            wait_until(
                lambda: pg_blocked_by(rel.engine, [other_pid], guard_sessions.snapshot()),
                what="the other transaction waiting for Y's row",
            )
            release_y.set()  # Y fails; the work transaction commits; the settle step waits for X at the gate
            wait_until(
                lambda: y_taken.is_set() and pg_blocked_by(rel.engine, guard_sessions.snapshot(), [gate_pid]),
                what="the test's transaction holding Y, the settle step waiting for X",
            )
            gate.rollback()
            batch.join(60)
            taker.join(60)
        handle.close()
        assert "error" not in other_out, other_out.get("error")
        assert y_taken.is_set()
        assert "error" not in out, out.get("error")
        assert {d.message_id: d.reason for d in out["value"]} == {
            x: Reason.HANDLER_FAILED,
            y: Reason.HANDLER_FAILED,
        }
        assert deadlocks_retried(registry, "billing") == 1
        assert (hold.held, hold.timed_out) == (1, False)
        with rel.engine.connect() as conn:
            attempts: dict[str, int] = dict(
                conn.execute(
                    text("SELECT message_id, attempts FROM message_inbox WHERE message_id IN (:x, :y)"),
                    {"x": x, "y": y},
                ).all()
            )
            journaled: dict[str, int] = dict(
                conn.execute(
                    text(
                        "SELECT message_id, count(*) FROM message_log WHERE message_id IN (:x, :y) "
                        "GROUP BY message_id"
                    ),
                    {"x": x, "y": y},
                ).all()
            )
        assert attempts == {x: 1, y: 1}
        assert journaled == {x: 1, y: 1}
    finally:
        guard_sessions.close()
        hold.close()
        rel.close()
