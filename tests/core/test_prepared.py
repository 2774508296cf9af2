"""PostgreSQL: the guard's opening and committing statements are server-side prepared, and a connection whose
prepared statements the server lost (a pooler's ``DISCARD ALL``, a restarted backend) heals by itself.

Why: those two statements carry ``BEGIN``/``COMMIT`` in the same round trip (psycopg pipeline mode) and are
prepared once per connection so the server does not parse and plan them on every delivery. A prepared
statement can vanish behind psycopg's back; the guard must then answer that delivery "retry later" at worst,
never lose or double an effect, and run the next one normally.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from reliable import Reliability, idempotent_consumer
from reliable.decorator import GuardedHandler
from reliable.guard.decision import Reason
from tests.core.guard_helpers import applied, apply, env

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


def guard(rel: Reliability) -> GuardedHandler:
    def handler(e: Any, session: Session) -> None:
        apply(e, session)

    return idempotent_consumer(rel, group="prep", registry=CollectorRegistry())(handler)


def uid() -> str:
    return f"prep-{uuid.uuid4().hex[:8]}"


def prepared_on_pooled_connection(rel: Reliability) -> list[str]:
    with rel.engine.connect() as conn:
        return [str(s) for s in conn.execute(text("SELECT statement FROM pg_prepared_statements")).scalars()]


def test_the_opening_and_committing_statements_are_prepared_on_the_server(rel: Reliability) -> None:
    handle = guard(rel)
    for _ in range(3):
        assert handle.decide(env(uid())).reason is Reason.PROCESSED
    statements = prepared_on_pooled_connection(rel)
    assert any("INSERT INTO message_log" in s and s.startswith("WITH") for s in statements), statements
    assert any("INSERT INTO consume_progress" in s for s in statements), statements
    handle.close()


def test_prepared_statements_lost_behind_the_drivers_back_cost_at_most_one_retry(rel: Reliability) -> None:
    handle = guard(rel)
    first = uid()
    assert handle.decide(env(first)).reason is Reason.PROCESSED
    with rel.engine.connect() as conn:  # the guard's pooled connection: drop its statements, psycopg unaware
        conn.connection.driver_connection.pgconn.exec_(b"DEALLOCATE ALL")  # type: ignore[union-attr]
    second = uid()
    answer = handle.decide(env(second)).reason
    assert answer in (Reason.PROCESSED, Reason.DATABASE_UNAVAILABLE)
    if answer is Reason.DATABASE_UNAVAILABLE:  # the broker redelivers it
        assert handle.decide(env(second)).reason is Reason.PROCESSED
    third = uid()
    assert handle.decide(env(third)).reason is Reason.PROCESSED
    assert [applied(rel, m) for m in (first, second, third)] == [1, 1, 1]
    handle.close()


def test_a_restarted_backend_is_replaced_and_prepares_again(rel: Reliability) -> None:
    handle = guard(rel)
    assert handle.decide(env(uid())).reason is Reason.PROCESSED
    with rel.engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    killer = create_engine(rel.engine.url)  # not the guard's pool: its one connection is the victim
    try:
        with killer.begin() as other:
            assert other.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
    finally:
        killer.dispose()
    ids = [uid() for _ in range(3)]
    for m in ids:
        assert handle.decide(env(m)).reason is Reason.PROCESSED
    assert [applied(rel, m) for m in ids] == [1, 1, 1]
    handle.close()
