"""lock_messages (revive, void) beside a guard confirming one group's row of the message (MariaDB's locks).

InnoDB locks rows in the order of the index it reads. A statement reading ``message_inbox`` through its
``(message_id, status)`` index locks each row's entry there, then the row — also the entry of a row it
does not change, another group's of the same message. A guard confirming its group's row locks the row by
primary key (``SELECT … FOR UPDATE``), then — its ``UPDATE`` of ``status`` moves the row in that index —
the entry: the reverse order, a deadlock. Here the guard's side is its statements in its order on a
connection of the test's, so the interleaving is exact; the resolver's side must wait for the guard's row
(it locks the rows by primary key after reading their keys) and the guard's confirm must not be rolled back.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Sequence

from sqlalchemy import Connection, select
from sqlalchemy.exc import DBAPIError

from reliable import Reliability, outbox
from reliable.guard.db_errors import is_deadlock
from reliable.outbox.tables import inbox
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.stores.sql import SqlStore
from reliable.types import StubStatus
from tests.lock_waits import session_id, waiting
from tests.sweeper.helpers import T0, add_stub
from tests.waiting import wait_until

GROUPS = ("audit", "billing", "crm")


def _other_messages(rel: Reliability) -> None:
    """A hundred settled messages of the same groups: on a few rows alone InnoDB scans the table rather
    than read an index, and the lock order under test never arises."""
    for i in range(100):
        add_stub(rel, f"f{i:03d}", groups=GROUPS, status=StubStatus.CONFIRMED)


def _beside_a_guard(
    rel: Reliability,
    sweeper_step: Callable[[Connection], None],
    statement: str,
    ids: Sequence[str] = ("m",),
) -> None:
    """The guard locks billing's rows of ``ids``; ``sweeper_step`` runs in a transaction of its own at READ
    COMMITTED; once it has finished or waits, the guard confirms the rows and commits."""
    store = SqlStore(rel.engine)
    errors: list[BaseException] = []
    session: list[int] = []
    done = threading.Event()

    def sweeper() -> None:
        try:
            with outbox.read_committed(rel.engine) as conn:
                session.append(session_id(conn))
                sweeper_step(conn)
        except BaseException as exc:  # reported to the test below
            errors.append(exc)
        finally:
            done.set()

    def waits() -> bool:
        return waiting(rel.engine, session, statement)

    thread = threading.Thread(target=sweeper, name="sweeper", daemon=True)
    with rel.engine.connect() as guard:
        with guard.begin():
            store.no_gap_locks(guard)
            assert set(store.lock_inbox(guard, "billing", list(ids))) == set(ids)
            thread.start()
            wait_until(
                lambda: done.is_set() or (bool(session) and waits()), what="the sweeper done or waiting"
            )
            try:
                confirmed, _ = store.confirm(guard, "billing", list(ids), T0)
            except DBAPIError as exc:
                assert not is_deadlock(exc), f"the guard was rolled back to break a deadlock: {exc!r}"
                raise
            assert confirmed == len(ids)
        thread.join(60)
    assert not thread.is_alive()
    assert errors == []


def test_lock_messages_beside_a_guard_confirming_one_group_waits_instead_of_deadlocking(
    rel: Reliability,
) -> None:
    if rel.engine.dialect.name == "sqlite":
        return
    add_stub(rel, "m", groups=GROUPS)
    locked: list[outbox.Locked] = []

    def lock_step(conn: Connection) -> None:
        locked.append(outbox.lock_messages(conn, ["m"]))

    _beside_a_guard(rel, lock_step, "%message_inbox%")
    # it waited for billing's row and read it as the guard committed it
    assert [(g, s.value) for _, g, s in locked[0].rows] == [
        ("audit", "PENDING"),
        ("billing", "CONFIRMED"),
        ("crm", "PENDING"),
    ]
    assert locked[0].stubs == {"m"}


def test_a_topic_send_recorded_beside_a_guard_confirming_one_group_waits_instead_of_deadlocking(
    rel: Reliability,
) -> None:
    if rel.engine.dialect.name == "sqlite":
        return
    _other_messages(rel)
    add_stub(rel, "m", groups=GROUPS)
    due = T0 + dt.timedelta(minutes=1)
    resend = OutgoingMessage(message_id="m", topic="orders", body=b"body-m", send_count=1)

    def record_step(conn: Connection) -> None:
        outbox.record_sends(conn, [(outbox.SendAttempt(resend, SendReceipt(0, 9)), due)], T0)

    _beside_a_guard(rel, record_step, "UPDATE message_inbox%")
    with rel.engine.connect() as conn:
        of_m = select(inbox.c.consumer_group, inbox.c.status, inbox.c.resend_at).where(
            inbox.c.message_id == "m"
        )
        rows = conn.execute(of_m).all()
    # the open rows take the send's due time; billing's, confirmed meanwhile, was no longer PENDING
    assert {(g, StubStatus(s)) for g, s, _ in rows} == {
        ("audit", StubStatus.PENDING),
        ("billing", StubStatus.CONFIRMED),
        ("crm", StubStatus.PENDING),
    }
    assert {g for g, _, at in rows if at == due} == {"audit", "crm"}
