"""The write-behind journal for duplicates Redis answers as ``done`` (``journal_write_behind``, default on).

What a user gets by default: a duplicate answered by Redis costs no database commit, and every first delivery
is still journaled synchronously (that row, not the duplicate's, is what the guarantees rest on).
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.errors import ConfigurationError
from reliable.guard.decision import Reason
from reliable.stores.lease import lease_key
from tests.conftest import _ensure_clean_schema
from tests.core.guard_helpers import applied, apply, env, log_rows, make_rel

GROUP = "wb"


def _watermark(rel: Reliability, queue_id: int = 0) -> int | None:
    with rel.engine.connect() as conn:
        return conn.execute(
            text("SELECT max_offset FROM consume_progress WHERE consumer_group = :g AND queue_id = :q"),
            {"g": GROUP, "q": queue_id},
        ).scalar()


def _later(e: Envelope, by: int = 1000) -> Envelope:
    """The same message redelivered at a later offset."""
    return Envelope(e.message_id, e.topic, e.queue_id, e.queue_offset + by, e.body)


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def db_url(request: pytest.FixtureRequest) -> str:
    url = str(request.getfixturevalue(f"{request.param}_url"))
    _ensure_clean_schema(url)
    return url


@pytest.fixture
def sqlite_db(sqlite_url: str) -> str:
    _ensure_clean_schema(sqlite_url)
    return sqlite_url


def test_done_duplicates_wait_in_memory_until_flushed(db_url: str, redis_url: str, key_prefix: str) -> None:
    rel = make_rel(db_url, redis_url, key_prefix, journal_flush_ms=600_000)  # the default: write-behind
    handle = idempotent_consumer(rel, group=GROUP)(apply)
    try:
        first = env("wb-1")
        d1 = handle.decide(first)
        assert d1.reason is Reason.PROCESSED and d1.log_id is not None
        # a first delivery is journaled synchronously, watermark included
        assert [r[1] for r in log_rows(rel, "wb-1")] == ["SUCCESS"]
        assert _watermark(rel) == first.queue_offset

        dup = _later(first)
        d2 = handle.decide(dup)
        assert d2.reason is Reason.DUPLICATE_DONE_MARKER and d2.duplicate
        assert d2.log_id is None  # not written yet
        assert [r[1] for r in log_rows(rel, "wb-1")] == ["SUCCESS"]

        assert handle.flush_journal() == 1
        assert [r[1] for r in log_rows(rel, "wb-1")] == ["SUCCESS", "DUPLICATE"]
        assert _watermark(rel) == dup.queue_offset
        assert handle.flush_journal() == 0
        assert applied(rel, "wb-1") == 1
    finally:
        handle.close()
        rel.close()


def test_close_flushes_and_later_duplicates_are_written_at_once(
    sqlite_db: str, redis_url: str, key_prefix: str
) -> None:
    rel = make_rel(sqlite_db, redis_url, key_prefix, journal_write_behind=True, journal_flush_ms=600_000)
    handle = idempotent_consumer(rel, group=GROUP)(apply)
    try:
        e = env("wb-close")
        handle(e)
        handle(_later(e, 1))
        handle(_later(e, 2))
        assert len(log_rows(rel, "wb-close")) == 1
        handle.close()
        assert [r[1] for r in log_rows(rel, "wb-close")] == ["SUCCESS", "DUPLICATE", "DUPLICATE"]
        handle(_later(e, 3))  # after close: synchronous, nothing is left behind
        assert len(log_rows(rel, "wb-close")) == 4
    finally:
        rel.close()


def test_closing_reliability_writes_what_its_guards_still_hold(
    sqlite_db: str, redis_url: str, key_prefix: str
) -> None:
    """``rel.close()`` alone (guard never closed) leaves no row to arrive later from a timer or at exit."""
    rel = make_rel(sqlite_db, redis_url, key_prefix, journal_write_behind=True, journal_flush_ms=600_000)
    handle = idempotent_consumer(rel, group=GROUP)(apply)
    e = env("wb-rel-close")
    handle(e)
    handle(_later(e, 1))
    assert len(log_rows(rel, "wb-rel-close")) == 1
    rel.close()
    with Reliability(sqlite_db, None) as fresh:
        assert [r[1] for r in log_rows(fresh, "wb-rel-close")] == ["SUCCESS", "DUPLICATE"]


def test_a_full_buffer_is_written_by_the_delivering_thread(
    sqlite_db: str, redis_url: str, key_prefix: str
) -> None:
    rel = make_rel(
        sqlite_db,
        redis_url,
        key_prefix,
        journal_write_behind=True,
        journal_flush_rows=3,
        journal_flush_ms=600_000,
    )
    handle = idempotent_consumer(rel, group=GROUP)(apply)
    try:
        e = env("wb-full")
        handle(e)
        handle(_later(e, 1))
        handle(_later(e, 2))
        assert len(log_rows(rel, "wb-full")) == 1
        handle(_later(e, 3))  # third buffered row: one multi-row insert, in this call
        assert [r[1] for r in log_rows(rel, "wb-full")] == ["SUCCESS"] + ["DUPLICATE"] * 3
    finally:
        handle.close()
        rel.close()


def test_the_timer_writes_buffered_rows(sqlite_db: str, redis_url: str, key_prefix: str) -> None:
    rel = make_rel(sqlite_db, redis_url, key_prefix, journal_write_behind=True, journal_flush_ms=50)
    handle = idempotent_consumer(rel, group=GROUP)(apply)
    try:
        e = env("wb-timer")
        handle(e)
        handle(_later(e))
        deadline = time.monotonic() + 10.0
        while len(log_rows(rel, "wb-timer")) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)  # polling with a timeout, not synchronisation by sleeping
        assert [r[1] for r in log_rows(rel, "wb-timer")] == ["SUCCESS", "DUPLICATE"]
    finally:
        handle.close()
        rel.close()


def test_only_done_marker_duplicates_are_deferred(sqlite_db: str, redis_url: str, key_prefix: str) -> None:
    """A failed handler and a duplicate found by the database keep the synchronous journal."""
    rel = make_rel(sqlite_db, redis_url, key_prefix, journal_write_behind=True, journal_flush_ms=600_000)
    failures = [RuntimeError("boom")]

    def flaky(e: Envelope, session: Session) -> None:
        if failures:
            raise failures.pop()
        apply(e, session)

    handle = idempotent_consumer(rel, group=GROUP)(flaky)
    try:
        e = env("wb-sync")
        d = handle.decide(e)
        assert d.reason is Reason.HANDLER_FAILED and d.log_id is not None
        assert [r[1] for r in log_rows(rel, "wb-sync")] == ["RETRY"]
        assert handle.decide(_later(e, 1)).reason is Reason.PROCESSED
        assert rel.redis is not None
        handle.flush_markers()  # the marker is queued after the commit: let it land, then lose it
        rel.redis.delete(*rel.redis.keys(f"{key_prefix}:*"))  # Redis lost the done marker
        d3 = handle.decide(_later(e, 2))
        assert d3.reason is Reason.DUPLICATE_CONFIRMED and d3.log_id is not None
        assert [r[1] for r in log_rows(rel, "wb-sync")] == ["RETRY", "SUCCESS", "DUPLICATE"]
        assert handle.flush_journal() == 0
        assert applied(rel, "wb-sync") == 1
    finally:
        handle.close()
        rel.close()


def test_batch_mixes_deferred_and_synchronous_rows(sqlite_db: str, redis_url: str, key_prefix: str) -> None:
    rel = make_rel(sqlite_db, redis_url, key_prefix, journal_write_behind=True, journal_flush_ms=600_000)
    handle = idempotent_consumer(rel, group=GROUP)(apply)
    try:
        a = env("wb-a")
        handle(a)
        ds = handle.decide_batch([_later(a), env("wb-b"), _later(a, 2)])
        assert [d.reason for d in ds] == [
            Reason.DUPLICATE_DONE_MARKER,
            Reason.PROCESSED,
            Reason.DUPLICATE_IN_BATCH,
        ]
        assert [r[1] for r in log_rows(rel, "wb-a")] == ["SUCCESS", "DUPLICATE"]  # the twin: synchronous
        assert [r[1] for r in log_rows(rel, "wb-b")] == ["SUCCESS"]
        handle.flush_journal()
        assert [r[1] for r in log_rows(rel, "wb-a")] == ["SUCCESS", "DUPLICATE", "DUPLICATE"]
    finally:
        handle.close()
        rel.close()


def test_flush_settings_are_validated() -> None:
    with pytest.raises(ConfigurationError):
        Reliability("sqlite://", None, journal_flush_rows=0)
    with pytest.raises(ConfigurationError):
        Reliability("sqlite://", None, journal_flush_ms=-1)


_EXIT_SCRIPT = """
import sys
from reliable import Envelope, Reliability, idempotent_consumer
from sqlalchemy import text

rel = Reliability(sys.argv[1], sys.argv[2], key_prefix=sys.argv[3], journal_write_behind=True,
                  journal_flush_ms=600000)

@idempotent_consumer(rel, group="wb")
def handle(env, session):
    session.execute(text("SELECT 1"))

handle(Envelope("wb-exit", "orders", 0, 1, b"{}"))
handle(Envelope("wb-exit", "orders", 0, 2, b"{}"))
handle(Envelope("wb-exit-last", "orders", 0, 3, b"{}"))  # its done marker is queued, not yet sent
# no close(): the interpreter's exit must write the buffered duplicate row and send the queued marker
"""


def test_interpreter_exit_flushes(sqlite_db: str, redis_url: str, key_prefix: str) -> None:
    """A process that ends without ``close()`` still writes what its guard held back: the duplicate's
    journal row, and the last delivery's ``done`` marker (else the gone worker's lease stays in its place
    and the next delivery of that message, the usual duplicate after a restart, costs a database check)."""
    import subprocess
    import sys

    subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, sqlite_db, redis_url, key_prefix], check=True, timeout=120
    )
    rel = Reliability(sqlite_db, redis_url, key_prefix=key_prefix)
    try:
        assert [r[1] for r in log_rows(rel, "wb-exit")] == ["SUCCESS", "DUPLICATE"]
        assert rel.redis is not None
        marker = rel.redis.get(lease_key(key_prefix, GROUP, "wb-exit-last"))
        assert isinstance(marker, bytes) and marker.startswith(b"done"), marker
    finally:
        rel.close()


def test_write_behind_off_journals_done_duplicates_at_once(
    sqlite_db: str, redis_url: str, key_prefix: str
) -> None:
    rel = make_rel(sqlite_db, redis_url, key_prefix, journal_write_behind=False)
    handle = idempotent_consumer(rel, group=GROUP)(apply)
    try:
        first = env("wb-off")
        assert handle.decide(first).reason is Reason.PROCESSED
        d2 = handle.decide(_later(first))
        assert d2.reason is Reason.DUPLICATE_DONE_MARKER and d2.log_id is not None
        assert [r[1] for r in log_rows(rel, "wb-off")] == ["SUCCESS", "DUPLICATE"]
    finally:
        handle.close()
        rel.close()
