"""PostgreSQL: the guard's statements sent through libpq's pipeline mode (:mod:`reliable.stores.pg_pipeline`).

What a user needs: every value the guard binds reaches the server unchanged; a failing statement leaves the
connection usable; and psycopg throwing away every prepared statement of a session (it does on a rollback, a
``DROP`` or an ``ALTER`` once a handler's own query got prepared) never costs a delivery.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from sqlalchemy import text
from sqlalchemy.orm import Session

from reliable import Reliability, idempotent_consumer
from reliable.guard.decision import Reason
from reliable.stores import pg_pipeline
from tests.core.guard_helpers import CONNECTION_EVENTS, applied, apply, env

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


@pytest.fixture
def pg(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    conn = psycopg.connect(db_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
    yield conn
    conn.close()


def one(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...], prepared: set[bytes]) -> Any:
    out = pg_pipeline.run(
        conn.pgconn, prepared, pg_pipeline.Statements().get(sql), params, before=None, after=None
    )
    assert out.error is None, out.error
    return out.rows[0]


texts = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=200)
stamps = st.datetimes(
    min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(2200, 1, 1), timezones=st.just(dt.UTC)
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=texts, n=st.integers(-(2**63), 2**63 - 1), t=stamps, b=st.booleans(), none=st.none())
def test_every_bound_value_reaches_the_server_unchanged(
    pg: psycopg.Connection[Any], s: str, n: int, t: dt.datetime, b: bool, none: None
) -> None:
    prepared: set[bytes] = set()
    row = one(
        pg,
        "SELECT %s::text, %s::bigint::text, %s::timestamptz = %s::timestamptz, %s::boolean::text, "
        "%s::text IS NULL",
        (s, n, t, t.isoformat(), b, none),
        prepared,
    )
    assert row == (s, str(n), "t", "true" if b else "false", "t")
    pipelined = one(pg, "SELECT %s::timestamptz::text", (t,), prepared)
    direct = pg.execute("SELECT %s::timestamptz::text", (t,)).fetchone()
    assert direct is not None
    assert pipelined[0] == str(direct[0])


def test_a_failing_statement_leaves_the_connection_idle_and_usable(pg: psycopg.Connection[Any]) -> None:
    prepared: set[bytes] = set()
    stmts = pg_pipeline.Statements()
    bad = pg_pipeline.run(pg.pgconn, prepared, stmts.get("SELECT 1 / %s"), (0,), before=b"BEGIN", after=None)
    assert isinstance(bad.error, psycopg.errors.DivisionByZero)
    assert not prepared  # the rollback that follows may deallocate: parse again next time
    pg.execute("ROLLBACK")
    good = pg_pipeline.run(
        pg.pgconn, prepared, stmts.get("SELECT 4 / %s"), (2,), before=b"BEGIN", after=b"COMMIT"
    )
    assert good.error is None and good.rows == [("2",)]
    assert pg.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert pg.execute("SELECT 1").fetchone() == (1,)  # psycopg's own use of the connection is unaffected


def preparing(group: str, then: Callable[[Session], None] | None = None) -> Callable[[Any, Session], None]:
    """A handler whose own queries psycopg prepares after five runs, so that the guard's pooled connection
    holds prepared statements of psycopg's as well as the guard's; ``then`` runs after its write."""

    def handler(e: Any, session: Session) -> None:
        session.execute(text(f"SELECT count(*) FROM message_inbox WHERE consumer_group = '{group}'"))
        apply(e, session)
        if then is not None:
            then(session)

    return handler


def fresh(group: str, n: int) -> list[str]:
    return [f"{group}-{uuid.uuid4().hex[:8]}" for _ in range(n)]


def test_psycopg_deallocating_everything_on_a_rollback_costs_no_delivery(rel: Reliability) -> None:
    fail = {"now": False}

    def fail_once(_: Session) -> None:
        if fail["now"]:
            raise RuntimeError("handler failed once")

    handle = idempotent_consumer(rel, group="pl", registry=CollectorRegistry())(preparing("pl", fail_once))
    ids = fresh("pl", 8)
    assert [handle.decide(env(m)).reason for m in ids] == [Reason.PROCESSED] * 8
    with rel.engine.connect() as conn:  # the guard's pooled connection: psycopg holds prepared statements
        assert conn.connection.driver_connection._prepared._names  # type: ignore[union-attr]
    fail["now"] = True
    assert handle.decide(env(fresh("pl", 1)[0])).reason is Reason.HANDLER_FAILED
    fail["now"] = False
    after = fresh("pl", 3)
    assert [handle.decide(env(m)).reason for m in after] == [Reason.PROCESSED] * 3
    assert [applied(rel, m) for m in ids + after] == [1] * 11
    handle.close()


def test_an_applications_ddl_on_the_guards_connection_costs_no_delivery(rel: Reliability) -> None:
    """psycopg deallocates every prepared statement of a session when it sees a ``DROP`` or ``ALTER`` there
    (once it holds prepared statements of its own); an application sharing the engine may run one."""
    handle = idempotent_consumer(rel, group="dd", registry=CollectorRegistry())(preparing("dd"))
    ids = fresh("dd", 8)
    assert [handle.decide(env(m)).reason for m in ids] == [Reason.PROCESSED] * 8
    table = f"ddl_probe_{uuid.uuid4().hex[:8]}"
    with rel.engine.begin() as conn:  # the guard's pooled connection, committed: no rollback to watch
        held = conn.connection.driver_connection._prepared._names  # type: ignore[union-attr]
        assert held
        conn.exec_driver_sql(f"CREATE TABLE {table} (x int)")
        conn.exec_driver_sql(f"DROP TABLE {table}")
        assert not held  # psycopg deallocated everything, the guard's statements included
    after = fresh("dd", 3)
    assert [handle.decide(env(m)).reason for m in after] == [Reason.PROCESSED] * 3
    assert [applied(rel, m) for m in ids + after] == [1] * 11
    handle.close()


@pytest.mark.parametrize("step", ["savepoint rolled back", "temporary table dropped"])
def test_a_handlers_savepoint_rollback_or_ddl_costs_no_delivery(rel: Reliability, step: str) -> None:
    """Both run through psycopg between the guard's opener and closer, once psycopg holds prepared
    statements of its own; neither may cost the guard its closing statement."""

    def then(session: Session) -> None:
        conn = session.connection()
        if step == "savepoint rolled back":
            nested = conn.begin_nested()
            conn.exec_driver_sql("SELECT 1")
            nested.rollback()
        else:
            conn.exec_driver_sql("CREATE TEMP TABLE IF NOT EXISTS hs_scratch (x int)")
            conn.exec_driver_sql("DROP TABLE hs_scratch")

    handle = idempotent_consumer(rel, group="hs", registry=CollectorRegistry())(preparing("hs", then))
    ids = fresh("hs", 10)
    assert [handle.decide(env(m)).reason for m in ids] == [Reason.PROCESSED] * 10
    assert [applied(rel, m) for m in ids] == [1] * 10
    handle.close()


def test_the_guard_adds_no_engine_event_that_every_statement_would_pay_for(rel: Reliability) -> None:
    """Any engine-level listener makes SQLAlchemy dispatch events at every begin, statement and commit of
    every connection of the engine, the handler's own statements included."""
    handle = idempotent_consumer(rel, group="ev", registry=CollectorRegistry())(apply)
    assert handle.decide(env(f"ev-{uuid.uuid4().hex[:8]}")).reason is Reason.PROCESSED
    assert [name for name in CONNECTION_EVENTS if getattr(rel.engine.dispatch, name)] == []
    handle.close()


def test_a_guard_made_before_its_engine_ever_connected_works(
    rel: Reliability, db_url: str, redis_url: str, key_prefix: str
) -> None:
    """The engine's first connection is rolled back by SQLAlchemy through a stand-in proxy (no pool entry)."""
    fresh = Reliability(db_url, redis_url, key_prefix=key_prefix)
    try:
        handle = idempotent_consumer(fresh, group="first", registry=CollectorRegistry())(apply)
        mid = f"first-{uuid.uuid4().hex[:8]}"
        assert handle.decide(env(mid)).reason is Reason.PROCESSED
        assert applied(fresh, mid) == 1
        handle.close()
    finally:
        fresh.close()
