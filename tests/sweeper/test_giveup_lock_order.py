"""A sweeper giving a message up for one group while another group's consumer confirms it, on MariaDB too.

What users saw on MariaDB (InnoDB, REPEATABLE READ): the sweeper's batched give-up
(:func:`reliable.outbox.mark_dead_rows`) set its group's row DEAD and then derived the stub's status in an
``UPDATE message_stub … WHERE EXISTS (SELECT … FROM message_inbox …)``. InnoDB runs such a subquery as a
locking read: the stub row locked first, then a shared lock asked on *every other group's* inbox row of the
message — the reverse of the guard's order (its group's inbox row, then the stub). A consumer of the other
group confirming the same message at that moment closed a deadlock: either the sweeper's record transaction
was rolled back (the round failed: its give-ups, notices and send records lost until a later round) or the
consumer's was (its handler ran a second time: side effects outside the database repeated). Two sweepers
giving up two groups of one message at once deadlocked the same way. PostgreSQL's subqueries take no locks,
so the PostgreSQL runs never showed it.

A row the give-up has just set DEAD makes the stub DEAD whatever the other groups' rows say (DESIGN.md §1),
so the give-up now writes that without reading them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Connection, Engine, event, func, select
from sqlalchemy.orm import Session

from reliable import Envelope, Reason, Reliability, idempotent_consumer
from reliable.stores.sql_runner import STATEMENT_HOOKS
from reliable.sweeper import FixedBackoff, Sweeper
from reliable.sweeper.selection import notif
from reliable.types import StubStatus
from tests.core.guard_helpers import apply, env, ledger, ledger_md, per_group
from tests.lock_waits import ThreadSessions, waiting
from tests.sweeper.helpers import T0, Clock, QueueSender, add_stub, clean, get_inbox, get_stub, set_inbox
from tests.waiting import wait_until

SWEEPER_THREAD = "giveup-sweeper"
CONSUMER_THREAD = "giveup-consumer"


@pytest.fixture
def rels(server_url: str) -> Iterator[tuple[Reliability, Reliability]]:
    """The consumers' and the sweeper's own engines (two processes in production)."""
    consumers = Reliability(server_url, redis_url="", max_sends=3)
    sweeping = Reliability(server_url, redis_url="", max_sends=3)
    clean(consumers.engine)
    ledger_md.create_all(consumers.engine)
    with consumers.engine.begin() as conn:
        conn.execute(ledger.delete())
    yield consumers, sweeping
    consumers.close()
    sweeping.close()


def _notices(engine: Engine, message_id: str, group: str) -> int:
    with engine.connect() as conn:
        q = select(func.count()).where(notif.c.message_id == message_id, notif.c.consumer_group == group)
        return int(conn.execute(q.select_from(notif)).scalar_one())


@contextlib.contextmanager
def paused_at_stub_write(thread_name: str) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Holds the guard's thread ``thread_name`` at its first statement on ``message_stub`` (its settle, after
    it confirmed its inbox rows) until the test sets ``go``; ``there`` is set once it got there."""
    there, go = threading.Event(), threading.Event()

    def hook(conn: Connection, sql: str, params: Any, many: bool) -> None:
        if (
            threading.current_thread().name == thread_name
            and "UPDATE message_stub" in sql
            and not there.is_set()
        ):
            there.set()
            if not go.wait(30):
                raise TimeoutError("the test never let the guard go on")

    STATEMENT_HOOKS.append(hook)
    try:
        yield there, go
    finally:
        go.set()
        STATEMENT_HOOKS.remove(hook)


@contextlib.contextmanager
def paused_at_record(engine: Engine, thread_name: str) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Holds the sweeper's thread ``thread_name`` at its record transaction's lock read (its claim done and
    committed) until the test sets ``go``; ``there`` is set once it got there."""
    there, go = threading.Event(), threading.Event()

    def hook(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if (
            threading.current_thread().name == thread_name
            and "FOR UPDATE" in statement
            and "SKIP LOCKED" not in statement
            and not there.is_set()
        ):
            there.set()
            if not go.wait(30):
                raise TimeoutError("the test never let the sweeper go on")

    event.listen(engine, "before_cursor_execute", hook)
    try:
        yield there, go
    finally:
        go.set()
        event.remove(engine, "before_cursor_execute", hook)


def test_a_give_up_while_the_other_group_confirms_the_message_neither_fails_nor_repeats_the_handler(
    rels: tuple[Reliability, Reliability],
) -> None:
    consumers, sweeping = rels
    # "m": billing's budget is spent (3 sends of 3, none reached the broker); audit receives it now
    add_stub(consumers, "m", groups=["billing", "audit"], queue_offset=None, send_count=3)
    for mid in ("m",):  # audit's rows are not due: the sweeper's batch is billing's give-up alone
        set_inbox(consumers, mid, "audit", resend_at=T0 + dt.timedelta(hours=1))
    calls: list[str] = []

    def handle(e: Envelope, session: Session) -> None:
        calls.append(str(e.message_id))
        apply(e, session, note="audit")

    registry = CollectorRegistry()
    audit = idempotent_consumer(consumers, group="audit", registry=registry)(handle)
    decisions: list[Reason] = []
    sweeper = Sweeper(sweeping, QueueSender(), backoff=FixedBackoff((60.0,)), clock=Clock())
    sessions = ThreadSessions(sweeping.engine, SWEEPER_THREAD)
    errors: list[BaseException] = []
    dead: list[int] = []

    def sweep() -> None:
        try:
            dead.append(sweeper.run_once().dead)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    with (
        paused_at_record(sweeping.engine, SWEEPER_THREAD) as (at_record, record),
        paused_at_stub_write(CONSUMER_THREAD) as (at_settle, settle),
    ):
        round_ = threading.Thread(target=sweep, name=SWEEPER_THREAD, daemon=True)
        round_.start()
        assert at_record.wait(30), "the sweeper never recorded its give-up"
        consumer = threading.Thread(
            target=lambda: decisions.extend(d.reason for d in audit.decide_batch([env("m", b"body-m")])),
            name=CONSUMER_THREAD,
            daemon=True,
        )
        consumer.start()
        assert at_settle.wait(30), "the consumer never settled its stubs"
        record.set()
        try:
            # the give-up has run as far as it can while audit's confirmation of "m" is uncommitted
            wait_until(
                lambda: not round_.is_alive() or waiting(sweeping.engine, sessions.snapshot()),
                what="the sweeper's round to end or wait for the consumer",
            )
        finally:
            settle.set()
            sessions.close()
        consumer.join(30)
        round_.join(30)
    assert not consumer.is_alive() and not round_.is_alive()

    assert not errors, errors  # the round did its work: no deadlock rolled its record back
    assert dead == [1]
    assert decisions == [Reason.PROCESSED]
    deadlocks = registry.get_sample_value(
        "reliable_database_errors_total", {"group": "audit", "step": "deadlock_retried"}
    )
    assert not deadlocks, "the consumer's transaction was rolled back to break a deadlock"
    assert calls == ["m"]
    assert per_group(consumers) == {("audit", "m"): 1}
    assert get_inbox(consumers, "m", "billing").status is StubStatus.DEAD
    assert get_inbox(consumers, "m", "audit").status is StubStatus.CONFIRMED
    assert get_stub(consumers, "m").status is StubStatus.DEAD  # some group gave up (DESIGN.md §1)
    assert _notices(consumers.engine, "m", "billing") == 1  # a person is told, once


def test_a_sweep_round_settling_stubs_while_a_consumer_confirms_the_last_group_neither_fails(
    rels: tuple[Reliability, Reliability],
) -> None:
    """The round's settle walk (stubs whose last groups confirmed at one instant) read the inbox rows under
    the stub's lock on MariaDB: a consumer confirming the message's last open group at that moment
    deadlocked with it (a round in two failed on a busy topic)."""
    consumers, sweeping = rels
    add_stub(consumers, "m", groups=["billing", "audit"], queue_offset=None)
    set_inbox(consumers, "m", "billing", status=StubStatus.CONFIRMED)
    set_inbox(consumers, "m", "audit", resend_at=T0 + dt.timedelta(hours=1))  # not due: nothing to send
    registry = CollectorRegistry()
    audit = idempotent_consumer(consumers, group="audit", registry=registry)(
        lambda e, session: apply(e, session, note="audit")
    )
    sweeper = Sweeper(sweeping, QueueSender(), backoff=FixedBackoff((60.0,)), clock=Clock())
    sessions = ThreadSessions(sweeping.engine, SWEEPER_THREAD)
    errors: list[BaseException] = []
    decisions: list[Reason] = []

    def sweep() -> None:
        try:
            sweeper.run_once()
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    with paused_at_stub_write(CONSUMER_THREAD) as (at_settle, settle):
        consumer = threading.Thread(
            target=lambda: decisions.append(audit.decide(env("m", b"body-m")).reason),
            name=CONSUMER_THREAD,
            daemon=True,
        )
        consumer.start()
        assert at_settle.wait(30), "the consumer never settled its stub"
        round_ = threading.Thread(target=sweep, name=SWEEPER_THREAD, daemon=True)
        round_.start()
        try:
            wait_until(
                lambda: not round_.is_alive() or waiting(sweeping.engine, sessions.snapshot()),
                what="the sweeper's round to end or wait for the consumer",
            )
        finally:
            settle.set()
            sessions.close()
        consumer.join(30)
        round_.join(30)
    assert not consumer.is_alive() and not round_.is_alive()
    assert not errors, errors
    assert decisions == [Reason.PROCESSED]
    deadlocks = registry.get_sample_value(
        "reliable_database_errors_total", {"group": "audit", "step": "deadlock_retried"}
    )
    assert not deadlocks, "the consumer's transaction was rolled back to break a deadlock"
    assert per_group(consumers) == {("audit", "m"): 1}
    assert get_stub(consumers, "m").status is StubStatus.CONFIRMED
