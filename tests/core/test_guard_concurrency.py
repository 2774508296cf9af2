"""The consumer guard under load and faults: batches, workers racing on one id, journal commit modes, and a
database that goes away — against real SQLite, PostgreSQL, MariaDB and Redis (DESIGN.md §2).

The invariant everywhere: a ledger row written through ``session`` exists exactly once per message that was
ever acknowledged, and never for a message that was not. The single-delivery steps: test_guard.py.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import event
from sqlalchemy.orm import Session

from reliable import ConsumeResult, Envelope, GuardHooks, Reason, Reliability, idempotent_consumer
from reliable.stores.lease import lease_key
from reliable.types import StubStatus
from tests.conftest import _ensure_clean_schema
from tests.core.guard_helpers import (
    add_stub,
    applied,
    apply,
    counting,
    env,
    inbox_attempts,
    inbox_status,
    log_rows,
    make_rel,
    per_message,
    settled,
    stub_status,
    uid,
)


# --- batches -----------------------------------------------------------------------------------------------
def test_batch_mixed_outcomes(rel: Reliability, registry: CollectorRegistry) -> None:
    bad = uid("bad")

    @idempotent_consumer(rel, group="g", registry=registry)
    def handle(e: Envelope, session: Session) -> None:
        apply(e, session)
        if e.message_id == bad and e.reconsume_times == 0:
            raise RuntimeError("fails on the first delivery")

    a, b, c = uid("a"), uid("b"), uid("c")
    add_stub(rel, b, "g")
    add_stub(rel, c, "g", body=b"right")
    assert handle(env(a)) is ConsumeResult.SUCCESS  # already done before the batch
    batch = [env(a), env(b), env(b), env(bad), env(None), env(c, b"wrong"), env(uid("n"))]
    reasons = [d.reason for d in handle.decide_batch(batch)]
    assert reasons == [
        Reason.DUPLICATE_DONE_MARKER,
        Reason.PROCESSED,
        Reason.DUPLICATE_IN_BATCH,
        Reason.HANDLER_FAILED,
        Reason.MISSING_MESSAGE_ID,
        Reason.PAYLOAD_MISMATCH,
        Reason.PROCESSED,
    ]
    assert applied(rel, bad) == 0  # its savepoint was rolled back, the others' writes committed
    assert applied(rel, b) == 1 and stub_status(rel, b) is StubStatus.CONFIRMED
    assert handle.batch([env(bad, reconsume_times=1), env(b)]) == [ConsumeResult.SUCCESS] * 2
    assert set(per_message(rel).values()) == {1}
    handle.flush_journal()  # the done-marker duplicate's row is written behind (the default)
    assert len(log_rows(rel)) == 1 + len(batch) + 2


def test_batch_twin_of_failed_message_is_retried(rel: Reliability, registry: CollectorRegistry) -> None:
    @idempotent_consumer(rel, group="g", registry=registry)
    def handle(e: Envelope, session: Session) -> None:
        raise RuntimeError("x")

    m = uid("m")
    assert [d.reason for d in handle.decide_batch([env(m), env(m)])] == [
        Reason.HANDLER_FAILED,
        Reason.LEASE_CONFLICT,
    ]


# --- concurrency -------------------------------------------------------------------------------------------
def test_threads_racing_on_the_same_ids_apply_once(rel: Reliability, registry: CollectorRegistry) -> None:
    handle, _ = counting(rel, registry)
    ids = [uid("t") for _ in range(6)]
    for m in ids[:3]:
        add_stub(rel, m, "g")
    start = threading.Barrier(4, timeout=30)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            start.wait()
            for m in ids[seed:] + ids[:seed]:
                settled(handle, env(m))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert per_message(rel) == dict.fromkeys(ids, 1)


class _BarrierBeforeJournal(GuardHooks):
    """Holds every delivery after the fast path, before its work transaction, until all racers got there."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=30)

    def before_journal(self, envs: object) -> None:
        self.barrier.wait()


@pytest.mark.parametrize("warm", [False, True], ids=["lock-first", "claim-first"])
@pytest.mark.parametrize("with_stub", [True, False], ids=["stub", "inbox"])
def test_race_without_redis_database_admits_one(
    db_url: str, key_prefix: str, registry: CollectorRegistry, with_stub: bool, warm: bool
) -> None:
    """Redis disabled: both workers pass the (absent) fast path together; the row lock / key decides.

    The barrier sits right before the work transaction (both deliveries past the fast path, about to journal
    and lock the stub in one transaction) rather than inside the handler: the stub's row lock / the inbox key
    is what keeps the second worker out of the handler, so a barrier in there could never be reached by both
    — which is the property under test.
    """
    rel = make_rel(db_url, None, key_prefix)
    hook = _BarrierBeforeJournal(2)
    calls: list[int] = []

    @idempotent_consumer(rel, group="g", registry=registry, hooks=[hook])
    def handle(e: Envelope, session: Session) -> None:
        calls.append(1)
        apply(e, session)

    m = uid("r")
    if with_stub:
        add_stub(rel, m, "g")
    if warm:  # stub-less deliveries teach the guard to claim the inbox row before looking for a stub
        hook.barrier = threading.Barrier(1)
        for _ in range(3):
            handle(env(uid("w")))
        hook.barrier = threading.Barrier(2, timeout=30)
    results: list[Reason] = []

    def worker() -> None:
        results.append(handle.decide(env(m)).reason)

    try:
        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert hook.barrier.n_waiting == 0 and not hook.barrier.broken  # both really got past the fast path
        assert sorted(results) == sorted([Reason.PROCESSED, Reason.DUPLICATE_CONFIRMED])
        assert applied(rel, m) == 1 and calls.count(1) == (4 if warm else 1)
    finally:
        rel.close()


def test_stub_after_inbox_deliveries_is_still_locked_and_confirmed(
    rel: Reliability, registry: CollectorRegistry
) -> None:
    handle, _ = counting(rel, registry)
    for _ in range(3):
        assert handle.decide(env(uid("i"))).reason is Reason.PROCESSED
    m, bad = uid("s"), uid("s")
    add_stub(rel, m, "g")
    add_stub(rel, bad, "g", body=b"one")
    assert handle.decide(env(m)).reason is Reason.PROCESSED
    assert stub_status(rel, m) is StubStatus.CONFIRMED
    assert handle.decide(env(bad, b"two")).reason is Reason.PAYLOAD_MISMATCH
    assert [d.reason for d in handle.decide_batch([env(uid("i")), env(m), env(uid("i"))])] == [
        Reason.PROCESSED,
        Reason.DUPLICATE_DONE_MARKER,
        Reason.PROCESSED,
    ]
    assert set(per_message(rel).values()) == {1}


@pytest.mark.parametrize("durable", [True, False], ids=["durable-journal", "lazy-journal"])
def test_journal_commit_modes(db_url: str, redis_url: str, key_prefix: str, durable: bool) -> None:
    rel = make_rel(db_url, redis_url, key_prefix, journal_write_behind=False)  # every row synchronous
    try:
        handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry(), durable_journal=durable)(
            apply
        )
        m = uid("j")
        assert [handle.decide(env(m)).reason for _ in range(2)] == [
            Reason.PROCESSED,
            Reason.DUPLICATE_DONE_MARKER,
        ]
        assert [r[1] for r in log_rows(rel, m)] == ["SUCCESS", "DUPLICATE"]
        with rel.engine.connect() as conn:  # the lazy commit is local to the journal's own transaction
            if conn.dialect.name == "postgresql":
                assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "on"
    finally:
        rel.close()


@pytest.mark.parametrize(
    "bad_url",
    ["postgresql+psycopg://postgres@127.0.0.1:1/none", "sqlite:////nonexistent-dir/reliable/x.db"],
    ids=["postgres-down", "sqlite-unopenable"],
)
def test_database_down_means_reconsume_later_and_lease_released(
    bad_url: str, redis_url: str, key_prefix: str
) -> None:
    rel = Reliability(bad_url, redis_url, key_prefix=key_prefix)
    reg = CollectorRegistry()
    handle, calls = counting(rel, reg)
    m = uid("down")
    try:
        d = handle.decide(env(m))
        assert (d.result, d.reason) == (ConsumeResult.RECONSUME_LATER, Reason.DATABASE_UNAVAILABLE)
        assert calls == []
        assert rel.redis is not None and rel.redis.get(lease_key(key_prefix, "g", m)) is None
        assert (
            reg.get_sample_value("reliable_database_errors_total", {"group": "g", "step": "connect"}) or 0
        ) + (
            reg.get_sample_value("reliable_database_errors_total", {"group": "g", "step": "journal"}) or 0
        ) == 1
    finally:
        rel.close()


def test_failing_handler_in_batch_reruns_the_others_once_without_double_effects(
    rel: Reliability, registry: CollectorRegistry
) -> None:
    """The batch is optimistic: after a failure it rolls back and re-runs the rest with savepoints."""
    runs: list[str] = []
    bad = uid("bad")

    @idempotent_consumer(rel, group="g", registry=registry)
    def handle(e: Envelope, session: Session) -> None:
        runs.append(str(e.message_id))
        apply(e, session)
        if e.message_id == bad:
            raise RuntimeError("x")

    good = [uid("g") for _ in range(3)]
    reasons = [d.reason for d in handle.decide_batch([env(good[0]), env(bad), env(good[1]), env(good[2])])]
    assert reasons == [Reason.PROCESSED, Reason.HANDLER_FAILED, Reason.PROCESSED, Reason.PROCESSED]
    # first pass: good[0], bad (fails, all rolled back); second pass with savepoints: the three good ones
    assert runs == [good[0], bad, good[0], good[1], good[2]]
    assert per_message(rel) == dict.fromkeys(good, 1)


@pytest.mark.parametrize("backend", ["postgres", "mariadb"])  # SQLite's lock wait cannot be seen from outside
def test_a_handler_failing_after_another_worker_applied_the_message_answers_a_duplicate(
    backend: str, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    """Worker A's handler is slow; its lease ran out and worker B took the message, waiting on A's row lock.
    A's handler fails: its transaction rolls back, B applies the message and confirms it. A's failure is
    not one of a message still owed: it must not count an attempt — with ``max_attempts=1`` it dead-lettered
    the message, a DLQ copy of a message already applied —, and A answers it as a duplicate."""
    from tests.lock_waits import ThreadSessions, mysql_waiting, pg_blocked_by
    from tests.waiting import wait_until

    db_url: str = request.getfixturevalue(f"{backend}_url")
    _ensure_clean_schema(db_url)
    rel = make_rel(db_url, "", key_prefix, max_attempts=1)  # no Redis: B goes to the database at once
    try:
        m = uid("slow")
        add_stub(rel, m, "g")
        started, release, a_failed, b_done = (threading.Event() for _ in range(4))
        held: list[bool] = []

        def handler(e: Envelope, session: Session) -> None:
            if threading.current_thread().name == "A":
                started.set()
                release.wait(30)
                a_failed.set()
                raise RuntimeError("A's handler fails after its lease ran out")
            apply(e, session)

        def settle_after_b(conn: Any) -> None:
            """A's rollback frees the row B waits for; A's next transaction — the step that counts A's
            failure — and B then race for it. This test is about B winning (the other order is a plain
            failure counted before B came: max_attempts=1 gives the message up, and B answers so)."""
            if threading.current_thread().name == "A" and a_failed.is_set() and not held:
                held.append(b_done.wait(30))

        event.listen(rel.engine, "begin", settle_after_b)

        handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(handler)
        answers: dict[str, Any] = {}
        a = threading.Thread(target=lambda: answers.update(A=handle.decide(env(m))), name="A")

        def run_b() -> None:
            try:
                answers.update(B=handle.decide(env(m)))
            finally:
                b_done.set()

        b = threading.Thread(target=run_b, name="B")
        sessions = {t: ThreadSessions(rel.engine, t) for t in ("A", "B")}

        def b_waits() -> bool:  # B's own session, not any lock wait on the server
            if rel.engine.dialect.name == "postgresql":
                return pg_blocked_by(rel.engine, sessions["B"].snapshot(), sessions["A"].snapshot())
            return mysql_waiting(rel.engine, sessions["B"].snapshot(), "%message_inbox%")

        a.start()
        assert started.wait(30)
        b.start()
        wait_until(b_waits, what="B waiting on A's row lock")
        release.set()
        a.join(30)
        b.join(30)
        for s in sessions.values():
            s.close()
        assert held == [True]  # A's settle step waited for B
        assert answers["B"].reason is Reason.PROCESSED
        assert (answers["A"].reason, answers["A"].result) == (
            Reason.DUPLICATE_CONFIRMED,
            ConsumeResult.SUCCESS,
        )
        assert inbox_status(rel, "g", m) is StubStatus.CONFIRMED and inbox_attempts(rel, "g", m) == 0
        assert applied(rel, m) == 1
    finally:
        rel.close()
