"""Migration 0007 (PostgreSQL): the status indexes of message_inbox and message_stub hold only open rows, and
the sweeper's walks still use them when PostgreSQL runs them as prepared statements with a generic plan."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, bindparam, text

from reliable.migrate import downgrade, upgrade
from reliable.outbox import settle_slice
from reliable.sweeper.selection import due_statement
from tests import services
from tests.migration_support import engine_for

INDEXES = {
    "ix_message_inbox_status_resend_at": "message_inbox",
    "ix_message_stub_status_resend_at": "message_stub",
}


@pytest.fixture
def engine() -> Iterator[Engine]:
    with services.scratch_database("postgres") as url, engine_for(url) as eng:
        yield eng


def _index_defs(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN :names").bindparams(
                bindparam("names", list(INDEXES), expanding=True)
            )
        ).all()
    return {r[0]: r[1] for r in rows}


def _seed(conn: Connection) -> None:
    """3 000 stubs with one inbox row each: one in 100 PENDING and due, the rest CONFIRMED."""
    for table, group in (("message_stub", ""), ("message_inbox", "'g', ")):
        cols = "consumer_group, " if group else "topic, content, send_count, "
        vals = group or "'orders', '\\x00'::bytea, 1, "
        conn.execute(
            text(
                f"INSERT INTO {table} ({cols}message_id, status, resend_at, created_at, updated_at"
                f"{', attempts, resend_count' if group else ''}) SELECT {vals}'m-' || i,"
                " CASE WHEN i % 100 = 0 THEN 'PENDING' ELSE 'CONFIRMED' END,"
                f" now() - (i || ' seconds')::interval, now(), now(){', 0, 0' if group else ''}"
                " FROM generate_series(1, 3000) i"
            )
        )
    conn.execute(text("ANALYZE message_stub"))
    conn.execute(text("ANALYZE message_inbox"))


def test_status_indexes_are_partial_after_upgrade_and_full_after_downgrade(engine: Engine) -> None:
    upgrade(engine)
    defs = _index_defs(engine)
    assert set(defs) == set(INDEXES)
    for d in defs.values():
        assert "(status, resend_at) WHERE" in d and "'PENDING'" in d and "'DEAD'" in d, d
    with engine.begin() as conn:
        _seed(conn)
        # a confirmed row has no entry: the index holds the 30 open rows of 3 000 (ANALYZE sampled them all)
        for name in INDEXES:
            entries = conn.execute(
                text("SELECT reltuples FROM pg_class WHERE relname = :n"), {"n": name}
            ).scalar_one()
            assert 0 < entries <= 30, (name, entries)
    downgrade(engine, "0006")
    for d in _index_defs(engine).values():
        assert "WHERE" not in d, d
    upgrade(engine)
    assert all("WHERE" in d for d in _index_defs(engine).values())


def test_sweeper_walks_use_the_partial_indexes_under_a_generic_plan(engine: Engine) -> None:
    upgrade(engine)
    with engine.begin() as conn:
        _seed(conn)
    now = dt.datetime.now(dt.UTC)
    with engine.connect() as conn:
        # every statement prepared at once and planned without its parameter values: what a long-running
        # sweeper's connection ends up doing (psycopg prepares a statement after 5 runs)
        conn.connection.driver_connection.prepare_threshold = 0  # type: ignore[union-attr]
        with conn.begin():
            conn.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
            before = _scans(conn)
            due = conn.execute(
                due_statement(
                    now=now,
                    stuck_after=dt.timedelta(minutes=5),
                    max_sends=10,
                    limit=50,
                    dialect="postgresql",
                )
            ).all()
            assert len(due) == 30
            settle_slice(conn, now, None, 50)
            after = _scans(conn)
    # the backend's counters include the seeding's scans: compare what the two walks added
    added = {k: after[k] - before[k] for k in after}
    assert added["seq message_inbox"] == 0 and added["seq message_stub"] == 0, added
    assert all(added[f"index {name}"] > 0 for name in INDEXES), added


def _scans(conn: Connection) -> dict[str, int]:
    """This backend's sequential scans of the two tables and scans of the two indexes so far."""
    seq = conn.execute(
        text(
            "SELECT relname, seq_scan FROM pg_stat_xact_user_tables"
            " WHERE relname IN ('message_inbox', 'message_stub')"
        )
    ).all()
    idx = conn.execute(
        text("SELECT relname, pg_stat_get_xact_numscans(oid) FROM pg_class WHERE relname IN :n").bindparams(
            bindparam("n", list(INDEXES), expanding=True)
        )
    ).all()
    return {**{f"seq {r[0]}": int(r[1]) for r in seq}, **{f"index {r[0]}": int(r[1]) for r in idx}}
