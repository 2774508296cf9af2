"""The sweeper's settle slice beside a guard settling the same stub (MariaDB: the stub's status index).

A guard settling a stub locks the stub's row by primary key (``lock_open_stubs``, then ``settle_stubs``),
and its ``UPDATE`` of ``status`` then moves the row in ``ix_message_stub_status_resend_at``: the row first,
then that index entry. The sweeper's settle slice reads the next PENDING stubs' ids and then updates them.
On a busy topic most of those ids have been settled by their guards meanwhile, and MariaDB then answered
the ``UPDATE``'s ``status = 'PENDING' AND message_id IN (…)`` through the status index: each stub's entry
locked, then its row — the other order. The sweeper held the entry and waited for the row, the guard held
the row and waited for the entry: a deadlock (1213). Either the sweep round failed (an ERROR log and a
failed-round metric, seen 5 times in 2 725 rounds of a two-group stress run) or the guard's confirm was
rolled back and retried. The guard's side here is its own statements in its order on a connection of the
test's, and the guards that settle the other stubs meanwhile commit from inside the sweeper's transaction,
between its read and its update, so the interleaving is exact.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, event, insert, select, text, update
from sqlalchemy.exc import DBAPIError

from reliable import Reliability, outbox
from reliable.guard.db_errors import is_deadlock
from reliable.models import MessageInbox, MessageStub
from reliable.outbox.keys import by_primary_key
from reliable.outbox.tables import inbox, stub
from reliable.stores.sql import SqlStore
from reliable.types import StubStatus
from tests.lock_waits import session_id, waiting
from tests.sweeper.helpers import T0
from tests.waiting import wait_until

GROUPS = ("audit", "billing")
#: stubs settled by their guards while the sweeper's slice is between its read and its update
OTHERS = [f"n-{i:04d}" for i in range(300)]
#: the stub the guard of this test settles (billing confirmed it already; audit's guard is at work)
OURS = "m-1"


def _stage(rel: Reliability) -> None:
    ids = [OURS, *OTHERS]
    with rel.engine.begin() as conn:
        conn.execute(
            insert(MessageStub),
            [
                {"message_id": m, "topic": "T", "content": b"{}", "resend_at": T0 - dt.timedelta(seconds=i)}
                for i, m in enumerate(ids)
            ],
        )
        conn.execute(
            insert(MessageInbox),
            [
                {
                    "consumer_group": g,
                    "message_id": m,
                    "status": StubStatus.CONFIRMED if g == "billing" else StubStatus.PENDING,
                }
                for m in ids
                for g in GROUPS
            ],
        )


def _settle_others(rel: Reliability) -> None:
    """The guards of the other stubs: audit's rows confirmed and the stubs settled, committed."""
    with outbox.read_committed(rel.engine) as conn:  # as the guards run theirs; rows locked by key
        confirm = update(inbox).where(inbox.c.consumer_group == "audit", inbox.c.message_id.in_(OTHERS))
        conn.execute(by_primary_key(confirm.values(status=StubStatus.CONFIRMED), inbox))
        settled = update(stub).where(stub.c.message_id.in_(OTHERS))
        conn.execute(by_primary_key(settled.values(status=StubStatus.CONFIRMED, confirmed_at=T0), stub))
    if rel.engine.dialect.name != "postgresql":
        wait_until(lambda: _pending_entries(rel) < len(OTHERS) // 10, what="the old index entries purged")


def _pending_entries(rel: Reliability) -> int:
    """InnoDB's estimate of the PENDING entries of the stubs' status index: an entry moved by an ``UPDATE``
    counts until the server's purge removes it (moments later on a live server)."""
    sql = "EXPLAIN SELECT resend_at FROM message_stub FORCE INDEX (ix_message_stub_status_resend_at) "
    with rel.engine.connect() as conn:
        return int(conn.execute(text(sql + "WHERE status = 'PENDING'")).mappings().one()["rows"])


def test_a_settle_slice_beside_a_guard_settling_the_same_stub_never_deadlocks(rel: Reliability) -> None:
    if rel.engine.dialect.name == "sqlite":
        return  # one writer at a time: no row locks to order
    _stage(rel)
    store = SqlStore(rel.engine)
    errors: list[BaseException] = []
    sweeper_session: list[int] = []

    def settle() -> None:
        try:
            with outbox.read_committed(rel.engine) as conn:  # as the sweeper settles
                sweeper_session.append(session_id(conn))
                _between_read_and_update(conn, lambda: _settle_others(rel))
                outbox.settle_slice(conn, T0, None, 1000)
        except BaseException as exc:  # reported to the test below
            errors.append(exc)

    sweeper = threading.Thread(target=settle, name="settle", daemon=True)
    with rel.engine.connect() as guard:
        with guard.begin():
            store.no_gap_locks(guard)  # the guard's transaction, as it runs one
            # the guard: audit's inbox row locked and confirmed, then the open stub locked by key …
            assert set(store.lock_inbox(guard, "audit", [OURS])) == {OURS}
            guard.execute(
                update(MessageInbox)
                .where(MessageInbox.consumer_group == "audit", MessageInbox.message_id == OURS)
                .values(status=StubStatus.CONFIRMED)
            )
            locked = select(stub.c.message_id).where(stub.c.message_id == OURS).with_for_update()
            assert guard.execute(by_primary_key(locked, stub)).scalars().all() == [OURS]
            sweeper.start()
            wait_until(lambda: sweeper_session, what="the sweeper's session")

            def sweeper_settled_or_waits() -> bool:
                return not sweeper.is_alive() or waiting(rel.engine, sweeper_session, "%message_stub%")

            wait_until(sweeper_settled_or_waits, what="the settle done or waiting for the guard's stub")
            # … then settled (a deadlock here, or in the sweeper, was the defect)
            try:
                settled = store.settle_exact(guard, "audit", [OURS], T0)
            except DBAPIError as exc:
                assert not is_deadlock(exc), f"the guard was rolled back to break a deadlock: {exc!r}"
                raise
            assert settled == 1
        sweeper.join(60)
    assert not sweeper.is_alive()
    assert errors == []
    with rel.engine.connect() as conn:
        statuses = conn.execute(text("SELECT DISTINCT status FROM message_stub")).scalars().all()
    assert statuses == ["CONFIRMED"]


def _between_read_and_update(conn: Connection, run: Callable[[], None]) -> None:
    """Call ``run`` once, on ``conn``'s thread, just before ``conn``'s first ``UPDATE message_stub``."""
    done: list[bool] = []

    def before(_conn: Connection, _cursor: Any, statement: str, *_args: Any) -> None:
        if not done and statement.lstrip().upper().startswith("UPDATE MESSAGE_STUB"):
            done.append(True)
            run()

    event.listen(conn, "before_cursor_execute", before)
