"""A handler's own database error that surfaces where the guard runs its statements is the handler's
failure, not a database outage — answered as an outage it was redelivered for ever, never counted, never
dead-lettered, its non-database side effects repeated each time (PostgreSQL, real server).

Two ways it happens: a constraint the handler's writes break that PostgreSQL checks only at ``COMMIT``
(``DEFERRABLE INITIALLY DEFERRED``), and a handler that catches a database error and goes on — PostgreSQL
then refuses every later statement of the transaction (the idiom works on SQLite and MariaDB).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from reliable import ConsumeResult, Envelope, Reason, Reliability, idempotent_consumer
from reliable.types import StubStatus
from tests.conftest import _ensure_clean_schema
from tests.core.guard_helpers import applied, apply, env, inbox_attempts, inbox_status, make_rel, uid


@pytest.fixture
def rel(postgres_url: str, key_prefix: str) -> Iterator[Reliability]:
    _ensure_clean_schema(postgres_url)
    r = make_rel(postgres_url, "", key_prefix, max_attempts=2)
    with r.engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS hdb_child"))
        conn.execute(text("DROP TABLE IF EXISTS hdb_parent"))
        conn.execute(text("CREATE TABLE hdb_parent (id text PRIMARY KEY)"))
        conn.execute(
            text(
                "CREATE TABLE hdb_child (id text PRIMARY KEY, "
                "parent text REFERENCES hdb_parent DEFERRABLE INITIALLY DEFERRED)"
            )
        )
    yield r
    r.close()


def _child(session: Session, message_id: str, parent: str) -> None:
    session.execute(
        text("INSERT INTO hdb_child (id, parent) VALUES (:i, :p)"), {"i": message_id, "p": parent}
    )


@pytest.mark.postgres
def test_a_deferred_constraint_the_handler_breaks_is_its_failure_and_ends_dead_lettered(
    rel: Reliability,
) -> None:
    def handler(e: Envelope, session: Session) -> None:
        _child(session, e.message_id or "", "no-such-parent")  # checked at COMMIT only

    handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(handler)
    m = uid("orphan")
    first = handle.decide(env(m))
    assert (first.reason, first.result) == (Reason.HANDLER_FAILED, ConsumeResult.RECONSUME_LATER)
    assert isinstance(first.error, IntegrityError) and inbox_attempts(rel, "g", m) == 1
    last = handle.decide(env(m, reconsume_times=1))
    assert (last.reason, last.result) == (Reason.MAX_ATTEMPTS, ConsumeResult.DEAD_LETTER)
    assert inbox_status(rel, "g", m) is StubStatus.DEAD


@pytest.mark.postgres
def test_in_a_batch_only_the_handler_that_breaks_a_deferred_constraint_fails(rel: Reliability) -> None:
    bad = uid("bad")

    def handler(e: Envelope, session: Session) -> None:
        apply(e, session)
        if e.message_id == bad:
            _child(session, bad, "no-such-parent")

    handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(handler)
    good = [uid("good"), uid("good")]
    decisions = handle.decide_batch([env(good[0]), env(bad), env(good[1])])
    assert [d.reason for d in decisions] == [Reason.PROCESSED, Reason.HANDLER_FAILED, Reason.PROCESSED]
    assert applied(rel, good[0]) == applied(rel, good[1]) == 1 and applied(rel, bad) == 0
    assert inbox_attempts(rel, "g", bad) == 1


@pytest.mark.postgres
def test_a_handler_that_swallows_a_database_error_fails_with_a_hint(rel: Reliability) -> None:
    with rel.engine.begin() as conn:
        conn.execute(text("INSERT INTO hdb_parent (id) VALUES ('taken')"))

    def handler(e: Envelope, session: Session) -> None:
        # "insert it unless it exists": fine on SQLite and MariaDB; PostgreSQL has aborted the transaction
        with contextlib.suppress(IntegrityError):
            session.execute(text("INSERT INTO hdb_parent (id) VALUES ('taken')"))

    handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(handler)
    m = uid("swallow")
    d = handle.decide(env(m))
    assert (d.reason, d.result) == (Reason.HANDLER_FAILED, ConsumeResult.RECONSUME_LATER)
    assert "session.begin_nested()" in str(d.error) and inbox_attempts(rel, "g", m) == 1


@pytest.mark.mariadb
def test_a_deadlock_the_handler_catches_on_mariadb_is_its_failure_not_a_lone_commit(
    mariadb_url: str, key_prefix: str
) -> None:
    """InnoDB rolls a deadlock victim's whole transaction back — the guard's journal row and inbox
    confirmation with it. A handler that catches the deadlock and retries its statement goes on in a new
    implicit transaction: the guard committed that write alone and answered the message processed, so its
    next copy applied it again. Now the handler failed: nothing of the delivery is kept, the next copy
    applies it once."""
    import threading

    from tests.waiting import LOCK_WAITS, wait_until

    _ensure_clean_schema(mariadb_url)
    rel = make_rel(mariadb_url, "", key_prefix)
    try:
        with rel.engine.begin() as conn:
            conn.execute(
                text("CREATE TABLE IF NOT EXISTS hdb_acct (id INT PRIMARY KEY, v INT) ENGINE=InnoDB")
            )
            conn.execute(
                text("CREATE TABLE IF NOT EXISTS hdb_big (id INT AUTO_INCREMENT PRIMARY KEY, x INT)")
            )
            conn.execute(text("DELETE FROM hdb_acct"))
            conn.execute(text("INSERT INTO hdb_acct VALUES (1, 0), (2, 0)"))
        other_holds, other_result = threading.Event(), list[str]()

        def other() -> None:  # a bigger transaction (InnoDB picks the smaller as the victim): row 2, then 1
            with rel.engine.connect() as conn:
                conn.execute(text("INSERT INTO hdb_big (x) SELECT seq FROM seq_1_to_3000"))
                conn.execute(text("UPDATE hdb_acct SET v = v + 100 WHERE id = 2"))
                other_holds.set()
                conn.execute(text("UPDATE hdb_acct SET v = v + 100 WHERE id = 1"))  # waits for the handler
                conn.commit()
                other_result.append("committed")

        def handler(e: Envelope, session: Session) -> None:
            apply(e, session)
            session.execute(text("UPDATE hdb_acct SET v = v + 1 WHERE id = 1"))
            if not worker.is_alive() and not other_result:  # first delivery: make the deadlock
                worker.start()
                assert other_holds.wait(30)
                with rel.engine.connect() as watch:
                    wait_until(
                        lambda: (
                            watch.execute(
                                text(LOCK_WAITS["mysql"].replace("message_inbox", "hdb_acct"))
                            ).scalar_one()
                            >= 1
                        ),
                        what="the other transaction waiting",
                    )
            for _ in range(3):  # "retry on deadlock", as many helpers do
                try:
                    session.execute(text("UPDATE hdb_acct SET v = v + 1 WHERE id = 2"))
                    break
                except OperationalError:
                    continue

        worker = threading.Thread(target=other)
        handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(handler)
        m = uid("deadlock")
        first = handle.decide(env(m))
        worker.join(30)
        assert other_result == ["committed"]
        assert (first.reason, first.result) == (Reason.HANDLER_FAILED, ConsumeResult.RECONSUME_LATER)
        assert "deadlock" in str(first.error) and applied(rel, m) == 0
        assert handle.decide(env(m, reconsume_times=1)).reason is Reason.PROCESSED
        assert applied(rel, m) == 1
        with rel.engine.connect() as conn:
            accounts = {int(i): int(v) for i, v in conn.execute(text("SELECT id, v FROM hdb_acct"))}
        assert accounts == {1: 101, 2: 101}  # the handler's +1 each, once; the other transaction's +100 each
    finally:
        rel.close()
