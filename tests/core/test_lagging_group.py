"""A group that keeps up while another group on the same topic owes a backlog (DESIGN.md §2).

A confirm settles the message's stub only when no *other* group still owes the message, so every confirm
asks about the other groups. The lagging group's backlog is its PENDING inbox rows, exactly the rows the
open-status index holds; in production that is millions of rows. The question must be asked by message
id. If a confirm walks the backlog instead, the group that keeps up slows to the lagging group's pace: a
bench measured 0.01 of the normal speed with the per-message index missing
(``python -m bench.bench_growth --lagging``).

Checked on PostgreSQL with generic plans, which are what a long-running consumer's prepared statements
end up with, on MariaDB with the plan of the statement its guard sends, and on SQLite with the plans of the
two statements its guard sends, as prepared.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text

from reliable import ConsumeResult, Reliability, StubStatus, idempotent_consumer
from reliable.facade import make_engine
from reliable.migrate import upgrade
from reliable.stores import sql_text
from tests import services
from tests.core.guard_helpers import (
    add_stub,
    env,
    inbox_status,
    ledger_writer,
    make_rel,
    per_group,
    stub_status,
)
from tests.waiting import wait_until

BACKLOG = 3000
LAGGING = "search"
KEEPS_UP = "billing"
PER_MESSAGE_INDEX = "ix_message_inbox_message_id_status"
OPEN_STATUS_INDEX = "ix_message_inbox_status_resend_at"


#: per backend: the ids ``1 … BACKLOG`` as rows of ``i``, the message id and a time ``i`` ms from now made of
#: ``i``, the statements that analyse both tables
_DIALECT = {
    "postgres": (
        f"generate_series(1, {BACKLOG}) AS s(i)",
        "concat('old-', i)",
        "now() + i * interval '1 ms'",
        ["ANALYZE message_inbox", "ANALYZE message_stub"],
    ),
    "mariadb": (
        f"(SELECT seq AS i FROM seq_1_to_{BACKLOG}) s",
        "concat('old-', i)",
        "now() + INTERVAL i * 1000 MICROSECOND",
        ["ANALYZE TABLE message_inbox, message_stub"],
    ),
    "sqlite": (
        f"(WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {BACKLOG}) "
        "SELECT i FROM s)",
        "'old-' || i",
        "strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || (i / 1000.0) || ' seconds')",
        ["ANALYZE"],
    ),
}


@contextmanager
def _scratch(kind: str) -> Iterator[str]:
    if kind != "sqlite":
        with services.scratch_database(kind) as url:
            yield url
        return
    with tempfile.TemporaryDirectory() as d:
        yield f"sqlite:///{d}/lagging.db"


@contextmanager
def _owing_a_backlog(kind: str) -> Iterator[tuple[str, Engine]]:
    """A database of its own at head, holding ``BACKLOG`` older messages that both groups must process: one
    group has, the other owes; analysed, so its plans are those of a table that size."""
    series, message_id, at, analyse = _DIALECT[kind]
    with _scratch(kind) as url:
        engine = make_engine(url)
        try:
            upgrade(engine)
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "INSERT INTO message_stub (message_id, topic, content, send_count, status, "
                        f"resend_at, created_at, updated_at) SELECT {message_id}, 'orders', :c, 1, "
                        f"'PENDING', {at}, {at}, {at} FROM {series}"
                    ),
                    {"c": b"\x00"},
                )
                for group, status in ((KEEPS_UP, "CONFIRMED"), (LAGGING, "PENDING")):
                    conn.execute(
                        text(
                            "INSERT INTO message_inbox (consumer_group, message_id, status, attempts, "
                            f"resend_count, resend_at, created_at, updated_at) SELECT :g, {message_id}, "
                            f":s, 0, 0, {at}, {at}, {at} FROM {series}"
                        ),
                        {"g": group, "s": status},
                    )
                for statement in analyse:
                    conn.execute(text(statement))
            yield url, engine
        finally:
            engine.dispose()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A database of its own: its plan settings and statistics counters are this test's alone."""
    with _owing_a_backlog("postgres") as (url, engine):
        with engine.begin() as conn:
            name = conn.execute(text("SELECT current_database()")).scalar_one()
            # every connection opened from now on plans its prepared statements without their values
            conn.execute(text(f"ALTER DATABASE {name} SET plan_cache_mode = force_generic_plan"))
        engine.dispose()  # the test's connections are all opened after the setting
        yield url


def _inbox_counters(engine: Engine) -> dict[str, int]:
    """message_inbox's sequential scans, rows updated and scans of its two status indexes, over the
    database's life (a server process reports its counters when it exits)."""
    with engine.connect() as conn:
        seq, updated = conn.execute(
            text("SELECT seq_scan, n_tup_upd FROM pg_stat_user_tables WHERE relname = 'message_inbox'")
        ).one()
        rows = conn.execute(
            text("SELECT indexrelname, idx_scan FROM pg_stat_user_indexes WHERE relname = 'message_inbox'")
        ).all()
    scans = {str(r[0]): int(r[1]) for r in rows}
    return {
        "seq": int(seq),
        "updated": int(updated),
        PER_MESSAGE_INDEX: scans.get(PER_MESSAGE_INDEX, 0),
        OPEN_STATUS_INDEX: scans.get(OPEN_STATUS_INDEX, 0),
    }


def test_the_group_that_keeps_up_confirms_by_message_id_and_leaves_the_backlog_to_its_owner(
    pg_url: str, redis_url: str, key_prefix: str
) -> None:
    rel: Reliability = make_rel(pg_url, redis_url, key_prefix)
    registry = CollectorRegistry()
    keeps_up = idempotent_consumer(rel, group=KEEPS_UP, registry=registry)(ledger_writer(KEEPS_UP))
    lagging = idempotent_consumer(rel, group=LAGGING, registry=registry)(ledger_writer(LAGGING))
    probe = make_engine(pg_url)
    ids = [f"new-{i}" for i in range(20)]
    try:
        for m in ids:
            add_stub(rel, m, [KEEPS_UP, LAGGING])
        before = _inbox_counters(probe)

        assert [keeps_up(env(m)) for m in ids] == [ConsumeResult.SUCCESS] * len(ids)
        rel.engine.dispose()  # the guard's server processes exit and report their counters
        wait_until(lambda: _inbox_counters(probe)["updated"] >= before["updated"] + len(ids))
        after = _inbox_counters(probe)
        added = {k: after[k] - before[k] for k in after}
        # each confirm asked about its own message; none read the lagging group's backlog
        assert added["seq"] == 0 and added[OPEN_STATUS_INDEX] == 0, added
        assert added[PER_MESSAGE_INDEX] >= len(ids), added

        # the stubs wait for the lagging group, whose rows the confirms left as they were
        assert {stub_status(rel, m) for m in ids} == {StubStatus.PENDING}
        assert {inbox_status(rel, LAGGING, m) for m in ids} == {StubStatus.PENDING}
        assert {inbox_status(rel, KEEPS_UP, m) for m in ids} == {StubStatus.CONFIRMED}

        # the lagging group catches up on these messages: each applied once per group, the stubs settle
        assert [lagging(env(m)) for m in ids] == [ConsumeResult.SUCCESS] * len(ids)
        assert {keeps_up(env(m)) for m in ids} == {
            ConsumeResult.SUCCESS
        }  # redelivered: answered, not applied
        assert per_group(rel) == {(g, m): 1 for g in (KEEPS_UP, LAGGING) for m in ids}
        assert {stub_status(rel, m) for m in ids} == {StubStatus.CONFIRMED}
        assert stub_status(rel, "old-1") is StubStatus.PENDING  # the older backlog is still owed
    finally:
        rel.close()
        probe.dispose()


def test_on_mariadb_the_confirms_question_about_other_groups_uses_the_message_id_index() -> None:
    """MariaDB has neither partial indexes nor generic plans: the statement its guard sends to settle a stub
    (:func:`reliable.stores.sql_text.settle_stubs`) must still reach the other groups' rows by message id."""
    settle = sql_text.settle_stubs(1)
    for value in ("now()", "now()", "'old-7'", f"'{KEEPS_UP}'"):  # its parameters: now twice, id, group
        settle = settle.replace("?", value, 1)
    with _owing_a_backlog("mariadb") as (_, engine), engine.connect() as conn:
        plan = {str(r["table"]): r for r in conn.execute(text(f"EXPLAIN {settle}")).mappings()}
    assert plan["i"]["key"] == PER_MESSAGE_INDEX and plan["i"]["type"] == "ref", plan
    assert plan["message_stub"]["key"] == "PRIMARY", plan


def test_on_sqlite_a_confirm_reaches_inbox_rows_by_key_not_through_the_backlog() -> None:
    """SQLite plans a statement when it is prepared, and the guard's statements stay prepared on their
    connection: the confirm of the group's own row (:func:`reliable.stores.sql_text.confirm_first`) must
    find it by primary key, and the settle (:func:`reliable.stores.sql_text.settle_stubs`) the other groups'
    rows by message id — neither through the open-status index, which holds the lagging group's backlog."""
    statements = {
        "confirm": (sql_text.confirm_first(False), ("t", "t", KEEPS_UP, "old-7", None, None)),
        "settle": (sql_text.settle_stubs(1), ("t", "t", "old-7", KEEPS_UP)),
    }
    with _owing_a_backlog("sqlite") as (_, engine), engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        plans = {
            name: [str(row[3]) for row in raw.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
            for name, (sql, params) in statements.items()
        }
    steps = plans["confirm"] + plans["settle"]
    assert not [p for p in steps if p.startswith("SCAN") or OPEN_STATUS_INDEX in p], plans
    # today the settle uses ix_message_inbox_message_id_status; without it SQLite skip-scans the primary
    # key per group, also by message id: either is fine, a walk of the open rows is not
    assert any(p.startswith("SEARCH message_inbox ") and "message_id=?" in p for p in plans["confirm"]), plans
    assert any(p.startswith("SEARCH i ") and "message_id=?" in p for p in plans["settle"]), plans
    assert any(p.startswith("SEARCH message_stub ") and "message_id=?" in p for p in plans["settle"]), plans
