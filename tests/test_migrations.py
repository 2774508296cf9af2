"""Migrations and schema: upgrade/downgrade cycles, one schema three ways, UTC timestamps, index use.

Every cycle runs on a database of its own (``services.scratch_database``), never the shared session databases,
which other tests expect at head.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, select, text
from sqlalchemy.exc import StatementError

from reliable import Reliability, StubStatus
from reliable.facade import make_engine
from reliable.migrate import alembic_config, current, downgrade, upgrade
from reliable.models import MessageLog, MessageStub, metadata
from tests import services

ROOT = Path(__file__).resolve().parent.parent
ALEMBIC = str(Path(sys.executable).parent / "alembic")
TABLES = set(metadata.tables)  # the three contract tables plus whatever later revisions add
CONTRACT_TABLES = {"message_stub", "message_log", "consume_progress"}
SCRIPTS = ScriptDirectory.from_config(alembic_config())
HEAD = SCRIPTS.get_current_head()
#: base → head, one revision per step
REVISIONS = [r.revision for r in reversed(list(SCRIPTS.walk_revisions()))]
KINDS = ["sqlite", "postgres", "mariadb"]


@pytest.fixture
def fresh(tmp_path: Path) -> Callable[[str], AbstractContextManager[str]]:
    """``fresh(kind)``: a context manager giving the URL of an empty database nobody else uses."""
    counter = iter(range(1000))

    @contextmanager
    def make(kind: str) -> Iterator[str]:
        if kind == "sqlite":
            yield f"sqlite:///{tmp_path / f'fresh{next(counter)}.db'}"
        else:
            with services.scratch_database(kind) as url:
                yield url

    return make


@contextmanager
def engine_for(url: str) -> Iterator[Engine]:
    engine = make_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def snapshot(engine: Engine) -> dict[str, Any]:
    """Everything a DBA would compare: tables, columns (type, nullability, default), PK/CK names, indexes."""
    insp = inspect(engine)
    out: dict[str, Any] = {}
    for table in sorted(set(insp.get_table_names()) - {"alembic_version"}):
        pk = insp.get_pk_constraint(table)
        out[table] = {
            "columns": [
                (c["name"], str(c["type"]), c["nullable"], str(c.get("default")), c.get("autoincrement"))
                for c in insp.get_columns(table)
            ],
            "pk": (pk.get("name"), tuple(pk["constrained_columns"])),
            "indexes": sorted(
                (
                    i["name"],
                    tuple(str(c) for c in i["column_names"]),
                    bool(i["unique"]),
                    # a partial index's predicate (migration 0007, PostgreSQL)
                    str(i.get("dialect_options", {}).get("postgresql_where")),
                )
                for i in insp.get_indexes(table)
            ),
            "checks": sorted(
                (c["name"], " ".join(str(c["sqltext"]).replace("(", " ").replace(")", " ").split()))
                for c in insp.get_check_constraints(table)
            ),
        }
    return out


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
        assert set(inspect(engine).get_table_names()) - {"alembic_version"} == set()
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
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
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


# --- 0003: data moved forward and back -------------------------------------------------------------------

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


def _rows(engine: Engine, table: str, *, skip: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every row of ``table``, key-sorted, timestamps as UTC-aware values (backend-neutral)."""
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(text(f"SELECT * FROM {table}"))]
    out = []
    for r in rows:
        for k, v in list(r.items()):
            if k in skip:
                del r[k]
            elif isinstance(v, dt.datetime):
                r[k] = v if v.tzinfo else v.replace(tzinfo=dt.UTC)
            elif isinstance(v, str) and k.endswith("_at") and v:
                r[k] = dt.datetime.fromisoformat(v).replace(tzinfo=dt.UTC)
            elif isinstance(v, memoryview):
                r[k] = bytes(v)
        out.append(r)
    return sorted(out, key=lambda r: sorted((k, str(v)) for k, v in r.items()))


def _unordered(schema: dict[str, Any]) -> dict[str, Any]:
    """A snapshot with columns sorted: a downgrade re-adds a dropped column last (no backend can place it)."""
    return {t: {**v, "columns": sorted(v["columns"])} for t, v in schema.items()}


def _seed_0002(engine: Engine) -> None:
    """A 0002 database as the one-group code left it: producer stubs, a guard-made stub, failures, notices."""
    stub = (
        "INSERT INTO message_stub (message_id, topic, tags, consumer_group, content, payload_hash, status,"
        " send_count, queue_id, queue_offset, resend_at, created_at, updated_at, last_sent_at, confirmed_at,"
        " last_error) VALUES (:m, 'orders', NULL, :g, :c, :h, :s, :n, :q, :o, :r, :t0, :t1, :ls, :ca, :e)"
    )
    later = T0 + dt.timedelta(seconds=5)
    cols = ("m", "g", "c", "h", "s", "n", "q", "o", "r", "t0", "t1", "ls", "ca", "e")
    rows = [
        dict(zip(cols, values, strict=True))
        for values in (
            # producer stub, resent twice, handler failed twice in g1
            ("a", "g1", b"A", "ha", "PENDING", 3, 1, 7, later, T0, later, later, None, "timeout"),
            # producer stub, sent once, confirmed later
            ("b", "g2", b"B", "hb", "CONFIRMED", 1, 0, 3, later, T0, later, T0, later, None),
            # the old guard's own row (inbox pattern): confirmed when created, never sent
            ("c", "g1", b"C", "hc", "CONFIRMED", 0, None, None, None, T0, T0, None, T0, None),
            # resends exhausted
            ("d", "g1", b"D", "hd", "DEAD", 8, 2, 9, None, T0, later, later, None, "gave up"),
        )
    ]
    log = (
        "INSERT INTO message_log (message_id, consumer_group, topic, queue_id, queue_offset, reconsume_times,"
        " received_at, outcome, reason) VALUES (:m, :g, 'orders', 1, :o, 0, :t, :out, :why)"
    )
    logs = [
        dict(m="a", g="g1", o=7, t=T0 + dt.timedelta(seconds=1), out="RETRY", why="handler_failed: boom"),
        dict(m="a", g="g1", o=7, t=T0 + dt.timedelta(seconds=2), out="RETRY", why="handler_failed: boom"),
        dict(m="a", g="g1", o=7, t=T0 + dt.timedelta(seconds=3), out="RETRY", why="lease_conflict"),
        dict(m="c", g="g1", o=4, t=T0, out="SUCCESS", why="processed"),
    ]
    notice = (
        "INSERT INTO stub_notification (message_id, channel, reason, created_at, attempts)"
        " VALUES ('d', :ch, 'resends exhausted', :t, 0)"
    )
    with engine.begin() as conn:
        conn.execute(text(stub), rows)
        conn.execute(text(log), logs)
        conn.execute(text(notice), [dict(ch="log", t=T0), dict(ch="email", t=T0)])


@pytest.mark.parametrize("kind", KINDS)
def test_0003_moves_data_forward_and_back(
    kind: str, fresh: Callable[[str], AbstractContextManager[str]]
) -> None:
    with fresh(kind) as url, engine_for(url) as engine:
        upgrade(engine, "0002")
        schema_0002 = _unordered(snapshot(engine))
        _seed_0002(engine)
        before = {
            t: _rows(engine, t, skip=("id",)) for t in ("message_stub", "message_log", "stub_notification")
        }

        upgrade(engine, "0003")
        inbox = {(r["consumer_group"], r["message_id"]): r for r in _rows(engine, "message_inbox")}
        assert set(inbox) == {("g1", "a"), ("g2", "b"), ("g1", "c"), ("g1", "d")}
        a = inbox["g1", "a"]
        # attempts: journaled handler failures only (not the lease conflict); resends: send_count - 1
        assert (a["status"], a["attempts"], a["resend_count"], a["last_error"]) == (
            "PENDING",
            2,
            2,
            "timeout",
        )
        assert a["resend_at"] == T0 + dt.timedelta(seconds=5) and a["payload_hash"] == "ha"
        assert a["first_received_at"] == T0 + dt.timedelta(seconds=1)
        assert inbox["g2", "b"]["status"] == "CONFIRMED" and inbox["g2", "b"]["confirmed_at"] is not None
        assert inbox["g1", "d"]["status"] == "DEAD"
        # the guard-made row is an inbox row now, not a producer stub; the rest keep their send history
        stubs = {r["message_id"]: r for r in _rows(engine, "message_stub")}
        assert set(stubs) == {"a", "b", "d"}
        assert (stubs["a"]["send_count"], stubs["a"]["queue_id"], stubs["a"]["queue_offset"]) == (3, 1, 7)
        assert {r["original_topic"] for r in _rows(engine, "message_log")} == {"orders"}
        notices = _rows(engine, "stub_notification")
        assert {(n["message_id"], n["consumer_group"], n["channel"]) for n in notices} == {
            ("d", "g1", "log"),
            ("d", "g1", "email"),
        }
        at_0003 = TABLES & set(inspect(engine).get_table_names())  # later revisions add more tables
        after_up = {t: _rows(engine, t, skip=("id",)) for t in at_0003}

        downgrade(engine, "0002")
        assert _unordered(snapshot(engine)) == schema_0002
        back = {t: _rows(engine, t, skip=("id",)) for t in before}
        # the guard-made row comes back as the old guard's stub, with an empty body (0003 keeps no body)
        expected_stubs = [
            {**r, "content": b"", "tags": None} if r["message_id"] == "c" else r
            for r in before["message_stub"]
        ]
        assert back["message_stub"] == expected_stubs
        assert back["message_log"] == before["message_log"]
        assert back["stub_notification"] == before["stub_notification"]

        upgrade(engine, "0003")
        assert {t: _rows(engine, t, skip=("id",)) for t in at_0003} == after_up


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_0003_downgrade_keeps_one_group_of_a_fan_out(
    kind: str, fresh: Callable[[str], AbstractContextManager[str]]
) -> None:
    """The 0002 schema holds one group per message: the group that still owes work is the one kept."""
    with fresh(kind) as url, engine_for(url) as engine:
        upgrade(engine, "0003")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO message_stub (message_id, topic, content, payload_hash, status, send_count,"
                    " created_at, updated_at) VALUES ('f', 'orders', :c, 'hf', 'PENDING', 1, :t, :t)"
                ),
                dict(c=b"F", t=T0),
            )
            conn.execute(
                text(
                    "INSERT INTO message_inbox (consumer_group, message_id, status, attempts, resend_count,"
                    " created_at, updated_at) VALUES (:g, 'f', :s, 0, :n, :t, :t)"
                ),
                [
                    dict(g="audit", s="CONFIRMED", n=0, t=T0),
                    dict(g="billing", s="PENDING", n=4, t=T0),
                    dict(g="search", s="PENDING", n=0, t=T0),
                ],
            )
        downgrade(engine, "0002")
        (stub,) = _rows(engine, "message_stub")
        # billing: the first group still owing work; its 4 targeted resends count against the old budget
        assert (stub["consumer_group"], stub["status"], stub["send_count"]) == ("billing", "PENDING", 5)


@pytest.mark.parametrize("kind", KINDS)
def test_0006_broker_name_moves_data_forward_and_back(
    kind: str, fresh: Callable[[str], AbstractContextManager[str]]
) -> None:
    """0006 adds the broker group to every position ('' for existing rows) and to the watermark's key; the
    downgrade folds the watermarks of one queue id on several groups into the one row the old key holds."""
    progress = (
        "INSERT INTO consume_progress (consumer_group, topic, {b}queue_id, max_offset, min_offset,"
        " created_at, updated_at, received_count) VALUES (:g, 'orders', {bv}:q, :hi, :lo, :c, :u, :n)"
    )
    with fresh(kind) as url, engine_for(url) as engine:
        upgrade(engine, "0005")
        schema_0005 = _unordered(snapshot(engine))
        t1, t2 = T0 + dt.timedelta(seconds=1), T0 + dt.timedelta(seconds=2)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO message_stub (message_id, topic, content, status, send_count, queue_id,"
                    " queue_offset, created_at, updated_at)"
                    " VALUES ('a', 'orders', :c, 'PENDING', 1, 0, 7, :t, :t)"
                ),
                dict(c=b"A", t=T0),
            )
            conn.execute(
                text(
                    "INSERT INTO message_log (message_id, consumer_group, topic, queue_id, queue_offset,"
                    " reconsume_times, received_at) VALUES ('a', 'g', 'orders', 0, 7, 0, :t)"
                ),
                dict(t=T0),
            )
            conn.execute(text(progress.format(b="", bv="")), dict(g="g", q=0, hi=7, lo=0, c=T0, u=T0, n=8))
        before = {t: _rows(engine, t) for t in ("message_stub", "message_log", "consume_progress")}

        upgrade(engine, "0006")
        for table, rows in before.items():  # every old row kept, with broker_name ''
            assert _rows(engine, table) == [{**r, "broker_name": ""} for r in rows]
        with engine.begin() as conn:  # two groups' queue 0 now have a watermark each, beside the old row
            conn.execute(
                text(progress.format(b="broker_name, ", bv=":b, ")),
                [
                    dict(g="g", b="broker-a", q=0, hi=90, lo=3, c=t1, u=t1, n=5),
                    dict(g="g", b="broker-b", q=0, hi=2, lo=1, c=t2, u=t2, n=2),
                ],
            )
        assert len(_rows(engine, "consume_progress")) == 3

        downgrade(engine, "0005")
        assert _unordered(snapshot(engine)) == schema_0005
        (folded,) = _rows(engine, "consume_progress")
        assert (folded["max_offset"], folded["min_offset"], folded["received_count"]) == (90, 0, 15)
        assert (folded["created_at"], folded["updated_at"]) == (T0, t2)
        assert _rows(engine, "message_stub") == before["message_stub"]
        assert _rows(engine, "message_log") == before["message_log"]

        upgrade(engine, "0006")
        assert [r["broker_name"] for r in _rows(engine, "consume_progress")] == [""]
