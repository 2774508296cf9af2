"""A pooled connection is checked at checkout without a round trip, and a dead one never costs a delivery.

Why: the guard checks a connection out once per delivery; ``pool_pre_ping`` made that a ``SELECT 1`` each
time. :mod:`reliable.pool_liveness` pings only a connection whose socket shows the server hung up, or one idle
longer than ``pool_ping_idle_s``. What a user needs from that: a database restart or a killed session between
two deliveries is invisible (the next delivery is processed, no ``database_unavailable``), and a connection in
steady use pays no ping.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from reliable import Reliability, idempotent_consumer
from reliable.guard.decision import Reason
from reliable.pool_liveness import install
from tests.core.guard_helpers import applied, apply, env, ledger_md

pytestmark = pytest.mark.parametrize("db_url", ["postgres", "mariadb"], indirect=True)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def count_pings(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the dialect's pings (the only statement a checkout may send)."""
    pings = [0]
    real = engine.dialect.do_ping

    def counted(dbapi_conn: Any) -> bool:
        pings[0] += 1
        return real(dbapi_conn)

    monkeypatch.setattr(engine.dialect, "do_ping", counted)
    return pings


def kill_session_of(engine: Engine) -> None:
    """Kill the server session of ``engine``'s one pooled connection and wait until it is gone."""
    with engine.connect() as conn:
        pg = engine.dialect.name == "postgresql"
        pid = conn.execute(text("SELECT pg_backend_pid()" if pg else "SELECT connection_id()")).scalar_one()
    killer = create_engine(engine.url.render_as_string(hide_password=False))
    try:
        with killer.begin() as other:
            if pg:  # with a timeout it returns once the backend has exited (PostgreSQL ≥ 14)
                assert other.execute(text("SELECT pg_terminate_backend(:p, 5000)"), {"p": pid}).scalar_one()
            else:  # KILL returns once the session is marked: wait until its thread has closed it
                other.execute(text(f"KILL {int(pid)}"))
                gone = text("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = :p")
                deadline = time.monotonic() + 10.0
                while other.execute(gone, {"p": pid}).scalar_one():
                    assert time.monotonic() < deadline, f"session {pid} still listed 10 s after KILL"
                    time.sleep(0.01)
    finally:
        killer.dispose()


def test_a_connection_in_steady_use_is_not_pinged_an_idle_one_is(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(db_url)
    clock = Clock()
    install(engine, idle_s=5.0, clock=clock)
    pings = count_pings(engine, monkeypatch)
    try:
        for _ in range(5):
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            clock.now += 1.0
        assert pings[0] == 0
        clock.now += 10.0  # idle past idle_s: a silent network path is only found by asking
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        assert pings[0] == 1
    finally:
        engine.dispose()


def test_a_killed_session_between_deliveries_costs_no_delivery(rel: Reliability) -> None:
    def handler(e: Any, session: Session) -> None:
        apply(e, session)

    handle = idempotent_consumer(rel, group="live", registry=CollectorRegistry())(handler)
    first = f"live-{uuid.uuid4().hex[:8]}"
    assert handle.decide(env(first)).reason is Reason.PROCESSED
    kill_session_of(rel.engine)  # a moment later: well within pool_ping_idle_s
    ids = [f"live-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    assert [handle.decide(env(m)).reason for m in ids] == [Reason.PROCESSED] * 3
    assert [applied(rel, m) for m in [first, *ids]] == [1, 1, 1, 1]
    handle.close()


def test_a_killed_session_is_replaced_at_checkout(db_url: str) -> None:
    engine = create_engine(db_url)
    install(engine)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        kill_session_of(engine)
        with engine.connect() as conn:  # no error: the pool swapped the dead connection for a new one
            assert conn.execute(text("SELECT 1")).scalar_one() == 1
    finally:
        engine.dispose()


def test_a_connection_its_first_statement_finds_dead_is_replaced_without_a_failed_delivery(
    db_url: str, redis_url: str, key_prefix: str
) -> None:
    """An engine of the user's own, without any checkout check: the guard's opener is what finds the dead
    session, and the guard runs the delivery again on a new connection (nothing of it had run)."""
    own = Reliability(engine=create_engine(db_url), redis=None, key_prefix=key_prefix)
    ledger_md.create_all(own.engine, checkfirst=True)

    def handler(e: Any, session: Session) -> None:
        apply(e, session)

    handle = idempotent_consumer(own, group="stale", registry=CollectorRegistry())(handler)
    try:
        first = f"stale-{uuid.uuid4().hex[:8]}"
        assert handle.decide(env(first)).reason is Reason.PROCESSED
        kill_session_of(own.engine)
        second = f"stale-{uuid.uuid4().hex[:8]}"
        assert handle.decide(env(second)).reason is Reason.PROCESSED
        assert [applied(own, m) for m in (first, second)] == [1, 1]
    finally:
        handle.close()
        own.close()
