"""Migrations and schema: upgrade/downgrade cycles, one schema three ways, UTC timestamps, index use.

Every cycle runs on a database of its own (``tests.migration_support``), never the shared session databases,
which other tests expect at head. The data the revisions move forward and back: test_migrations_data.py.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import StatementError

from reliable import Reliability, StubStatus
from reliable import constants as C
from reliable.migrate import alembic_config, current, downgrade, migration_lock, upgrade
from reliable.models import MessageLog, MessageStub, metadata
from tests.migration_support import KINDS, TABLES, engine_for, fresh_databases, snapshot

ROOT = Path(__file__).resolve().parent.parent
ALEMBIC = str(Path(sys.executable).parent / "alembic")
CONTRACT_TABLES = {"message_stub", "message_log", "consume_progress"}
SCRIPTS = ScriptDirectory.from_config(alembic_config())
HEAD = SCRIPTS.get_current_head()
#: base → head, one revision per step
REVISIONS = [r.revision for r in reversed(list(SCRIPTS.walk_revisions()))]


@pytest.fixture
def fresh(tmp_path: Path) -> Callable[[str], AbstractContextManager[str]]:
    """``fresh(kind)``: a context manager giving the URL of an empty database nobody else uses."""
    return fresh_databases(tmp_path)


def run_alembic(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RELIABLE_DB_URL"}
    return subprocess.run(
        [ALEMBIC, "-x", f"db_url={url}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("kind", KINDS)
def test_upgrade_downgrade_upgrade(kind: str, fresh: Callable[[str], AbstractContextManager[str]]) -> None:
    with fresh(kind) as url, engine_for(url) as engine:
        assert current(engine) is None
        upgrade(engine)
        assert current(engine) == HEAD
        first = snapshot(engine)
        assert set(first) == TABLES
        downgrade(engine, "base")
        assert current(engine) is None
        assert set(inspect(engine).get_table_names()) <= {C.ALEMBIC_VERSION_TABLE}
        upgrade(engine)
        assert current(engine) == HEAD
        assert snapshot(engine) == first
        # one revision at a time, down to base and back up: each step works on its own
        for below in reversed([None, *REVISIONS[:-1]]):
            downgrade(engine, "-1")
            assert current(engine) == below
        for rev in REVISIONS:
            upgrade(engine, "+1")
            assert current(engine) == rev
        assert snapshot(engine) == first


@pytest.mark.parametrize("kind", KINDS)
def test_create_schema_alembic_cli_and_models_agree(
    kind: str, fresh: Callable[[str], AbstractContextManager[str]]
) -> None:
    with fresh(kind) as a, fresh(kind) as b, fresh(kind) as c:
        with Reliability(a) as rel:
            rel.create_schema()
            via_facade = snapshot(rel.engine)
        proc = run_alembic(b, "upgrade", "head")
        assert proc.returncode == 0, proc.stderr
        with engine_for(b) as engine:
            via_cli = snapshot(engine)
            assert current(engine) == HEAD
        proc = run_alembic(b, "current")
        assert proc.returncode == 0 and f"{HEAD} (head)" in proc.stdout, proc.stdout + proc.stderr
        with engine_for(c) as engine:
            metadata.create_all(engine)
            via_models = snapshot(engine)
        assert via_facade == via_cli
        # the models are what the guard queries; they must describe the migrated schema exactly
        assert via_models == via_cli
        assert set(via_cli) == TABLES


@pytest.mark.parametrize("kind", KINDS)
def test_autogenerate_finds_no_drift_between_models_and_migrations(
    kind: str, fresh: Callable[[str], AbstractContextManager[str]]
) -> None:
    with fresh(kind) as url, engine_for(url) as engine:
        upgrade(engine)
        with engine.connect() as conn:
            opts = {"compare_type": True, "version_table": C.ALEMBIC_VERSION_TABLE}
            ctx = MigrationContext.configure(conn, opts=opts)
            assert compare_metadata(ctx, metadata) == []


def test_alembic_cli_without_url_fails_with_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RELIABLE_DB_URL"}
    proc = subprocess.run([ALEMBIC, "upgrade", "head"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "no database URL" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_alembic_cli_reads_reliable_db_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    env = {**os.environ, "RELIABLE_DB_URL": url}
    proc = subprocess.run([ALEMBIC, "upgrade", "head"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with engine_for(url) as engine:
        assert current(engine) == HEAD


# --- timestamps ------------------------------------------------------------------------------------------


def test_timestamps_round_trip_utc_aware(db_url: str) -> None:
    ist = dt.timezone(dt.timedelta(hours=5, minutes=30))
    created = dt.datetime(2026, 3, 29, 1, 30, 15, 123456, tzinfo=ist)  # a DST-change night in Europe
    with Reliability(db_url) as rel:
        with rel.session() as s:
            s.add(
                MessageStub(
                    message_id="ts-1",
                    topic="t",
                    content=b"",
                    status=StubStatus.PENDING,
                    send_count=0,
                    created_at=created,
                    updated_at=created,
                    resend_at=None,
                )
            )
        with rel.session() as s:
            row = s.get(MessageStub, "ts-1")
            assert row is not None
            assert row.created_at == created
            assert row.created_at.utcoffset() == dt.timedelta(0)
            assert row.created_at.microsecond == 123456
            assert row.resend_at is None
            # comparisons in SQL use the same instant whatever zone the parameter was written in
            same_instant = created.astimezone(dt.timezone(dt.timedelta(hours=-7)))
            assert (
                s.scalar(select(MessageStub.message_id).where(MessageStub.created_at == same_instant))
                == "ts-1"
            )
            later = created + dt.timedelta(microseconds=1)
            assert s.scalar(select(MessageStub.message_id).where(MessageStub.created_at < later)) == "ts-1"
            assert s.scalar(select(MessageStub.message_id).where(MessageStub.created_at < created)) is None
        with pytest.raises(StatementError, match="naive datetime"), rel.session() as s:
            s.add(
                MessageLog(
                    message_id="ts-2",
                    consumer_group="g",
                    topic="t",
                    queue_id=0,
                    queue_offset=0,
                    received_at=dt.datetime(2026, 1, 1, 12, 0),
                )
            )


# --- index use ------------------------------------------------------------------------------------------


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


def _indexes_used(conn: Any, sql: str, params: dict[str, Any]) -> set[str]:
    plan = conn.execute(text(f"EXPLAIN (FORMAT JSON) {sql}"), params).scalar()
    nodes = list(_plan_nodes(plan[0]["Plan"]))
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes), plan
    return {n["Index Name"] for n in nodes if "Index Name" in n}


def test_hot_queries_are_index_lookups_on_postgres(
    fresh: Callable[[str], AbstractContextManager[str]],
) -> None:
    with fresh("postgres") as url, engine_for(url) as engine:
        upgrade(engine)
        with engine.begin() as conn:
            # 20k stubs, each with an inbox row for one of 3 groups, 1% PENDING (the sweeper's working set),
            # 40k log rows, 4 queues of progress
            conn.execute(
                text(
                    "INSERT INTO message_stub (message_id, topic, content, status,"
                    " send_count, queue_id, queue_offset, resend_at, created_at, updated_at)"
                    " SELECT 'm-' || i, 'orders', '\\x00'::bytea,"
                    " CASE WHEN i % 100 = 0 THEN 'PENDING' ELSE 'CONFIRMED' END, 1, i % 4, i,"
                    " now() - (i || ' seconds')::interval, now(), now() FROM generate_series(1, 20000) i"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO message_inbox (consumer_group, message_id, status, attempts, resend_count,"
                    " resend_at, created_at, updated_at)"
                    " SELECT 'g' || (i % 3), 'm-' || i,"
                    " CASE WHEN i % 100 = 0 THEN 'PENDING' ELSE 'CONFIRMED' END, 0, 0,"
                    " now() - (i || ' seconds')::interval, now(), now() FROM generate_series(1, 20000) i"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO message_log (message_id, consumer_group, topic, queue_id, queue_offset,"
                    " reconsume_times, received_at, outcome)"
                    " SELECT 'm-' || (i % 20000), 'g' || (i % 3), 'orders', i % 4, i, 0, now(), 'SUCCESS'"
                    " FROM generate_series(1, 40000) i"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO consume_progress (consumer_group, topic, queue_id, max_offset, min_offset,"
                    " created_at, updated_at, received_count)"
                    " SELECT 'g' || g, 'orders', q, 1000, 0, now(), now(), 1000"
                    " FROM generate_series(0, 2) g, generate_series(0, 3) q"
                )
            )
            conn.execute(text("ANALYZE"))
        now = dt.datetime.now(dt.UTC)
        with engine.connect() as conn:
            assert _indexes_used(conn, "SELECT * FROM message_stub WHERE message_id = :m", {"m": "m-5"}) == {
                "pk_message_stub"
            }
            assert _indexes_used(
                conn,
                "SELECT * FROM message_stub WHERE message_id = :m FOR UPDATE",
                {"m": "m-5"},
            ) == {"pk_message_stub"}
            # the guard: lock one group's inbox row
            guard = (
                "SELECT status FROM message_inbox WHERE consumer_group = :g AND message_id = :m FOR UPDATE"
            )
            # (the planner may prefer the message_id index: ids are nearly unique; either is one lookup)
            assert _indexes_used(conn, guard, {"g": "g2", "m": "m-5"}) <= {
                "pk_message_inbox",
                "ix_message_inbox_message_id_status",
            }
            # deriving a stub's status from its inbox rows
            derive = "SELECT status FROM message_inbox WHERE message_id = :m"
            assert _indexes_used(conn, derive, {"m": "m-5"}) == {"ix_message_inbox_message_id_status"}
            sweep = (
                "SELECT consumer_group, message_id FROM message_inbox WHERE status = 'PENDING'"
                " AND resend_at <= :now ORDER BY resend_at LIMIT 500"
            )
            assert "ix_message_inbox_status_resend_at" in _indexes_used(conn, sweep, {"now": now})
            anti_join = (
                "SELECT i.message_id FROM message_inbox i JOIN message_stub s ON s.message_id = i.message_id"
                " WHERE i.status = 'PENDING' AND i.resend_at <= :now"
                " AND NOT EXISTS (SELECT 1 FROM message_log l WHERE l.message_id = i.message_id"
                " AND l.consumer_group = i.consumer_group) LIMIT 500"
            )
            used = _indexes_used(conn, anti_join, {"now": now})
            assert {
                "ix_message_inbox_status_resend_at",
                "pk_message_stub",
                "ix_message_log_message_id_consumer_group_received_at",
            } <= used
            newest = "SELECT max(received_at) FROM message_log WHERE message_id = :m AND consumer_group = :g"
            assert _indexes_used(conn, newest, {"m": "m-7", "g": "g1"}) == {
                "ix_message_log_message_id_consumer_group_received_at"
            }
            progress = (
                "SELECT max_offset FROM consume_progress WHERE consumer_group = :g AND topic = :t"
                " AND queue_id = :q"
            )
            # 12 rows fit in one page, where a sequential scan is honestly cheaper: make the planner show
            # that the primary key serves this lookup as soon as the table is not trivially small
            conn.execute(text("SET enable_seqscan = off"))
            assert _indexes_used(conn, progress, {"g": "g1", "t": "orders", "q": 2}) == {
                "pk_consume_progress"
            }


# --- a database shared with the application's own migrations; several processes migrating at once -------

_APP_REVISION = "a1b2c3d4e5f6"  # what an application's own Alembic migrations leave in alembic_version


def _legacy_rows(engine: Any) -> list[str]:
    with engine.connect() as conn:
        if not inspect(conn).has_table(C.LEGACY_ALEMBIC_VERSION_TABLE):
            return []
        return sorted(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())


def _app_migrated(engine: Any) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"))
        conn.execute(text("INSERT INTO alembic_version VALUES (:v)"), {"v": _APP_REVISION})


@pytest.mark.parametrize("kind", KINDS)
def test_the_applications_own_alembic_migrations_and_reliables_keep_apart(
    kind: str, fresh: Callable[[str], AbstractContextManager[str]]
) -> None:
    """The handler's writes go to the application's database, which has its own Alembic migrations. Both
    kept their revision in ``alembic_version``: whichever ran second failed ("Can't locate revision"), for
    good. reliable keeps its own table; the application's row is left alone."""
    with fresh(kind) as url, engine_for(url) as engine:
        _app_migrated(engine)
        upgrade(engine)
        assert current(engine) == HEAD
        assert _legacy_rows(engine) == [_APP_REVISION]
        upgrade(engine)  # again: nothing to do
        assert _legacy_rows(engine) == [_APP_REVISION]


@pytest.mark.parametrize("shared", [True, False], ids=["shared-with-the-app", "reliable-alone"])
def test_a_database_migrated_before_keeps_its_revision_in_reliables_own_table(
    fresh: Callable[[str], AbstractContextManager[str]], shared: bool
) -> None:
    """Before 2026-11-28 reliable's revision sat in ``alembic_version``: the first migration run moves it to
    ``reliable_alembic_version`` (and drops the old table when nothing else is in it); the schema is not
    created again."""
    with fresh("postgres") as url, engine_for(url) as engine:
        upgrade(engine)
        with engine.begin() as conn:  # as a deployment of before left it
            conn.execute(text(f"DROP TABLE {C.ALEMBIC_VERSION_TABLE}"))
        if shared:
            _app_migrated(engine)
        else:
            with engine.begin() as conn:
                conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)"))
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO alembic_version VALUES (:v)"), {"v": HEAD})
        assert current(engine) == HEAD  # read before anything moved
        upgrade(engine)
        assert current(engine) == HEAD
        assert _legacy_rows(engine) == ([_APP_REVISION] if shared else [])
        with engine.connect() as conn:
            assert inspect(conn).has_table(C.LEGACY_ALEMBIC_VERSION_TABLE) is shared


@pytest.mark.parametrize("kind", ["postgres", "mariadb"])
def test_replicas_creating_the_schema_at_once_all_start(
    kind: str, fresh: Callable[[str], AbstractContextManager[str]]
) -> None:
    """Every consumer calls ``create_schema()`` at start: six replicas starting together ran the same DDL at
    once, and all but one crashed (duplicate table, duplicate type, 'expected to match one row'). They take
    the migration lock in turn; the first migrates, the others find the schema at head."""
    with fresh(kind) as url:
        script = (
            "import sys; from reliable import Reliability; "
            "Reliability(sys.argv[1], redis_url='').create_schema()"
        )
        procs = [
            subprocess.Popen([sys.executable, "-c", script, url], stderr=subprocess.PIPE, text=True)
            for _ in range(6)
        ]
        failures = [err for p in procs if (err := p.communicate(timeout=300)[1]) and p.returncode != 0]
        assert failures == []
        with engine_for(url) as engine:
            assert current(engine) == HEAD


def test_a_migration_of_one_mariadb_database_holds_up_no_other(
    fresh: Callable[[str], AbstractContextManager[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A MariaDB named lock is server-wide: with one name for every database, a long migration of one
    tenant's database (0008 converts every table) held every other database's ``create_schema()``, which
    crashed after the lock's timeout."""
    monkeypatch.setattr(C, "MIGRATION_LOCK_TIMEOUT_S", 2)
    with ExitStack() as stack:
        busy, other = stack.enter_context(fresh("mariadb")), stack.enter_context(fresh("mariadb"))
        held, e = stack.enter_context(engine_for(busy)), stack.enter_context(engine_for(other))
        conn = stack.enter_context(held.connect())
        stack.enter_context(migration_lock(conn))  # a migration of `busy` in progress
        upgrade(e)
        assert current(e) == HEAD
