"""The guard under faults: Redis flushed or down, worker processes racing or killed, random schedules."""

from __future__ import annotations

import multiprocessing
import os
import signal
import uuid

import pytest
import redis as redis_lib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from sqlalchemy import make_url, text
from sqlalchemy.orm import Session

from reliable import ConsumeResult, Envelope, Reason, Reliability, idempotent_consumer
from reliable.stores.lease import lease_key
from tests.conftest import _ensure_clean_schema
from tests.core.guard_helpers import (
    add_stub,
    applied,
    apply,
    child_consume,
    child_die_in_handler,
    env,
    inbox_attempts,
    log_rows,
    make_rel,
    per_message,
)
from tests.pg_session_killer import SessionKiller
from tests.services import PrivateRedis
from tests.waiting import wait_until


def uid(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    v = registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


# --- Redis loses everything / goes away ------------------------------------------------------------------
def test_flushall_mid_stream_still_exactly_once(
    db_url: str, private_redis: PrivateRedis, key_prefix: str
) -> None:
    rel = make_rel(db_url, private_redis.url, key_prefix)
    reg = CollectorRegistry()
    handle = idempotent_consumer(rel, group="g", registry=reg)(apply)
    ids = [uid("f") for _ in range(8)]
    add_stub(rel, ids[0], "g")
    try:
        for n, m in enumerate(ids):
            assert handle(env(m)) is ConsumeResult.SUCCESS
            if n % 3 == 2:
                assert rel.redis is not None
                rel.redis.flushall()
            for earlier in ids[: n + 1]:  # every earlier message is redelivered after each step
                d = handle.decide(env(earlier))
                assert d.result is ConsumeResult.SUCCESS and d.duplicate
        assert per_message(rel) == dict.fromkeys(ids, 1)
        assert _sample(reg, "reliable_duplicates_suppressed_total", group="g", source="database") > 0
        assert _sample(reg, "reliable_duplicates_suppressed_total", group="g", source="redis") > 0
    finally:
        rel.close()


def test_redis_down_falls_back_to_the_database(
    db_url: str, private_redis: PrivateRedis, key_prefix: str
) -> None:
    rel = make_rel(db_url, private_redis.url, key_prefix, redis_socket_timeout_s=0.5)
    reg = CollectorRegistry()
    handle = idempotent_consumer(rel, group="g", registry=reg, redis_retry_after_s=0.0)(apply)
    before, during, after = uid("b"), uid("d"), uid("a")
    try:
        assert handle.decide(env(before)).reason is Reason.PROCESSED
        private_redis.stop()
        assert handle.decide(env(before)).reason is Reason.DUPLICATE_CONFIRMED
        assert handle.decide(env(during)).reason is Reason.PROCESSED
        assert handle.decide(env(during)).reason is Reason.DUPLICATE_CONFIRMED
        assert _sample(reg, "reliable_redis_fallbacks_total", operation="acquire") >= 3
        private_redis.start()  # back, but empty: the database still knows
        wait_until(lambda: handle.decide(env(after)).reason is Reason.PROCESSED)
        for m in (before, during, after):
            assert handle.decide(env(m)).duplicate
        assert per_message(rel) == {before: 1, during: 1, after: 1}
    finally:
        rel.close()


def test_circuit_stays_open_after_a_redis_failure(
    db_url: str, private_redis: PrivateRedis, key_prefix: str
) -> None:
    rel = make_rel(db_url, private_redis.url, key_prefix)
    reg = CollectorRegistry()
    handle = idempotent_consumer(rel, group="g", registry=reg, redis_retry_after_s=3600)(apply)
    try:
        private_redis.stop()
        assert handle(env(uid("x"))) is ConsumeResult.SUCCESS
        private_redis.start()
        m = uid("y")
        assert handle(env(m)) is ConsumeResult.SUCCESS
        assert rel.redis is not None
        assert rel.redis.get(lease_key(rel.settings.key_prefix, "g", m)) is None  # Redis not consulted
    finally:
        rel.close()


# --- processes --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_processes_racing_apply_once(db_url: str, redis_url: str, key_prefix: str) -> None:
    rel = make_rel(db_url, redis_url, key_prefix)
    ids = [uid("p") for _ in range(12)]
    for m in ids[::2]:
        add_stub(rel, m, "g")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2, timeout=60)
    procs = [
        ctx.Process(target=child_consume, args=(db_url, redis_url, key_prefix, ids[n:] + ids[:n], barrier))
        for n in (0, 6)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    try:
        assert [p.exitcode for p in procs] == [0, 0]
        assert per_message(rel) == dict.fromkeys(ids, 1)
        assert len(log_rows(rel)) >= 2 * len(ids)
    finally:
        rel.close()


@pytest.mark.slow
def test_killed_worker_leaves_nothing_and_lease_expiry_lets_the_message_through(
    db_url: str, redis_url: str, key_prefix: str
) -> None:
    """A worker dies inside its handler: nothing of it survives, its live lease makes the next delivery wait
    (never run beside it, never counted as a failure), and once the lease expires the message goes through
    exactly once. The expiry is driven, not waited for: ``PEXPIRE`` to 1 ms is the lease running out."""
    lease_ms = 120_000  # far longer than this test: the lease is certainly live when we first deliver
    rel = make_rel(db_url, redis_url, key_prefix, lease_ms=lease_ms)
    m = uid("k")
    add_stub(rel, m, "g")
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=child_die_in_handler, args=(db_url, redis_url, key_prefix, m, lease_ms))
    p.start()
    p.join(120)
    handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(apply)
    assert rel.redis is not None
    key = lease_key(rel.settings.key_prefix, "g", m)
    try:
        assert p.exitcode == 3
        assert applied(rel, m) == 0
        # the journal row rode in the work transaction that died with the worker (issue 18: one commit per
        # message); the delivery that finally runs journals it
        assert log_rows(rel, m) == []
        first = handle.decide(env(m))
        assert (first.result, first.reason) == (ConsumeResult.RECONSUME_LATER, Reason.LEASE_CONFLICT)
        assert inbox_attempts(rel, "g", m) == 0  # waiting for a lease is not a handler failure
        rel.redis.pexpire(key, 1)
        wait_until(lambda: rel.redis is not None and not rel.redis.exists(key))
        second = handle.decide(env(m))
        assert (second.result, second.reason) == (ConsumeResult.SUCCESS, Reason.PROCESSED)
        assert applied(rel, m) == 1
    finally:
        rel.close()


# --- random schedules -------------------------------------------------------------------------------------
_op = st.one_of(
    st.tuples(st.just("deliver"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("batch"), st.lists(st.integers(0, 3), min_size=1, max_size=4), st.booleans()),
    st.tuples(st.just("flush"), st.just(0), st.just(False)),
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schedule=st.lists(_op, min_size=1, max_size=10), stubbed=st.sets(st.integers(0, 3)))
def test_random_schedules_keep_the_ledger_invariant(
    db_url: str,
    private_redis: PrivateRedis,
    key_prefix: str,
    schedule: list[tuple[str, int | list[int], bool]],
    stubbed: set[int],
) -> None:
    """Deliveries, failing deliveries, batches, Redis flushes in any order: acked ⇔ applied exactly once."""
    rel = Reliability(db_url, private_redis.url, key_prefix=key_prefix)
    run = uuid.uuid4().hex[:6]
    ids = [f"h{run}-{n}" for n in range(4)]
    failing: set[str] = set()

    def handler(e: Envelope, session: Session) -> None:
        apply(e, session)
        if e.message_id in failing:
            raise RuntimeError("injected")

    handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(handler)
    for n in stubbed:
        add_stub(rel, ids[n], "g")
    acked: set[str] = set()
    try:
        for kind, arg, fail in schedule:
            if kind == "flush":
                assert rel.redis is not None
                rel.redis.flushall()
                continue
            picks = [ids[arg]] if isinstance(arg, int) else [ids[i] for i in arg]
            failing.clear()
            if fail:
                failing.add(picks[0])
            decisions = handle.decide_batch([env(m) for m in picks])
            for m, d in zip(picks, decisions, strict=True):
                if d.result is ConsumeResult.SUCCESS:
                    assert d.duplicate == (m in acked) or d.reason is Reason.DUPLICATE_IN_BATCH
                    acked.add(m)
                else:
                    assert m in failing or d.reason is Reason.LEASE_CONFLICT
            counts = {k: v for k, v in per_message(rel).items() if k in ids}
            assert counts == dict.fromkeys(acked, 1)
    finally:
        rel.close()


# --- the database goes away under the handler --------------------------------------------------------------
@pytest.mark.parametrize("backend", ["postgres", "mariadb"])  # SQLite: no session another client can end
def test_a_session_killed_while_the_handler_runs_is_an_outage_not_a_handler_failure(
    backend: str, request: pytest.FixtureRequest, redis_url: str, key_prefix: str
) -> None:
    """A failover or a DBA's kill ends the guard's own session mid-handler: the delivery is answered
    ``database_unavailable`` (retried), no attempt is counted — so a database that keeps dropping sessions
    cannot use up ``max_attempts`` and dead-letter a message whose handler never failed — and the redelivery
    is applied once."""
    db_url: str = request.getfixturevalue(f"{backend}_url")
    _ensure_clean_schema(db_url)
    rel = make_rel(db_url, redis_url, key_prefix, max_attempts=1)
    killed: list[str] = []

    def handler(e: Envelope, session: Session) -> None:
        apply(e, session)
        if not killed:
            killed.append(e.message_id or "")
            pg = rel.engine.dialect.name == "postgresql"
            me = session.execute(
                text("SELECT pg_backend_pid()" if pg else "SELECT CONNECTION_ID()")
            ).scalar_one()
            with rel.engine.connect() as admin:  # another session ends the guard's, as a DBA would
                admin.execute(text(f"SELECT pg_terminate_backend({int(me)})" if pg else f"KILL {int(me)}"))
                admin.commit()
            session.execute(text("SELECT 1"))  # the handler's next statement finds its session gone

    m = uid("k")
    add_stub(rel, m, "g")
    handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(handler)
    try:
        first = handle.decide(env(m))
        assert (first.reason, first.result) == (Reason.DATABASE_UNAVAILABLE, ConsumeResult.RECONSUME_LATER)
        assert inbox_attempts(rel, "g", m) == 0  # max_attempts=1: one counted failure would dead-letter it
        again = handle.decide(env(m, reconsume_times=1))
        assert again.reason is Reason.PROCESSED
        assert applied(rel, m) == 1
    finally:
        rel.close()


def test_a_delivery_is_journaled_when_the_settle_steps_pooled_connection_was_killed_too(
    postgres_url: str, key_prefix: str
) -> None:
    """A burst of killed sessions (a failover, a DBA killing a consumer's connections): the work transaction
    fails on its own dead session, and the settle step's connection — the next pooled one, killed too but
    not gone yet, so the pool's checkout check passed it — fails at its first statement. The delivery was
    answered with a retry and left no journal row: the report showed its offset as a gap, a loss signal
    for a message that was not lost. Once one connection of the pool is found dead, every checkout is pinged
    for a while (reliable.pool_liveness), so the settle step gets a live one."""
    _ensure_clean_schema(postgres_url)
    url = make_url(postgres_url)
    killer = SessionKiller((url.host or "127.0.0.1", url.port or 5432))
    rel = make_rel(url.set(host="127.0.0.1", port=killer.port).render_as_string(False), None, key_prefix)
    try:
        pooled = [rel.engine.connect() for _ in range(2)]  # two idle pooled sessions: the guard's next two
        for c in pooled:
            c.execute(text("SELECT 1"))
        for c in pooled:
            c.close()

        killed: list[int] = []

        def handler(e: Envelope, session: Session) -> None:
            apply(e, session)
            if not killed:  # the guard's session and the pooled one, each at its next request
                killed.append(killer.kill_open())

        handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(handler)
        m = uid("burst")
        first = handle.decide(env(m))
        assert killed == [2]
        assert first.result is ConsumeResult.RECONSUME_LATER  # nothing committed: redelivered
        assert [(row[0], row[1]) for row in log_rows(rel, m)] == [(m, "RETRY")]  # the delivery is on record
        again = handle.decide(env(m, reconsume_times=1))
        assert again.reason is Reason.PROCESSED and applied(rel, m) == 1
    finally:
        rel.close()
        killer.close()


def test_a_lease_that_lands_after_the_client_gave_up_does_not_block_redeliveries(
    sqlite_url: str, private_redis: PrivateRedis, key_prefix: str
) -> None:
    """The lease SET reaches Redis after the client timed out (the server stopped, as in DEBUG SLEEP or a
    stalled host): the guard decided on the database and the handler failed. The stray ``processing:``
    lease is compare-and-deleted once Redis answers again — it used to turn every redelivery into
    LEASE_CONFLICT until ``lease_ms`` ran out."""
    _ensure_clean_schema(sqlite_url)
    rel = make_rel(sqlite_url, private_redis.url, key_prefix, redis_socket_timeout_s=0.2, lease_ms=60_000)
    admin = redis_lib.Redis.from_url(private_redis.url, socket_timeout=5)
    mid, key = uid("m"), lease_key(key_prefix, "g", "")
    failures = [RuntimeError("first attempt fails")]

    @idempotent_consumer(rel, group="g", registry=CollectorRegistry(), redis_retry_after_s=0.05)
    def handle(e: Envelope, session: Session) -> None:
        if e.message_id == mid and failures:
            raise failures.pop()
        apply(e, session)

    try:
        assert handle.decide(env(uid("warm"))).reason is Reason.PROCESSED
        assert private_redis.proc is not None
        os.kill(private_redis.proc.pid, signal.SIGSTOP)  # our SET NX waits in its socket and times out
        try:
            assert handle.decide(env(mid)).reason is Reason.HANDLER_FAILED
        finally:
            os.kill(private_redis.proc.pid, signal.SIGCONT)
        wait_until(lambda: admin.get(key + mid), what="the late lease write to land")

        def redis_used_again() -> bool:  # any message decided through Redis: the breaker closed again
            other = uid("o")
            assert handle.decide(env(other)).reason is Reason.PROCESSED
            return bool(admin.get(key + other))

        wait_until(redis_used_again, what="the guard to use Redis again")
        assert handle.decide(env(mid, reconsume_times=1)).reason is Reason.PROCESSED
        assert per_message(rel)[mid] == 1
    finally:
        rel.close()
