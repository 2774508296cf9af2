"""The record's lock read of its claimed rows beside a guard confirming one of them (MariaDB's index locks).

The record step locks the batch's inbox rows (:func:`reliable.sweeper.claim.still_claimed`) by ``(group,
message_id)``. For a batch of one message in two groups the key list is ``message_id = m AND consumer_group
IN (…)``, and InnoDB read it through the ``(message_id, status)`` index: each row's index entry locked, then
its primary-key row. A guard confirming one group's row locks the other way round: the row by primary key
(its ``SELECT … FOR UPDATE``), then — its ``UPDATE`` of ``status`` moves the row in that index — the index
entry. The record held the entry and waited for the row; the guard held the row and waited for the entry: a
deadlock, and the sweep round failed before telling anyone of DEAD rows or stalls (with the settle walk's
share locks on that index as a third party, a busy two-group topic failed a round in a few hundred). The
guard's side here is its statements in its order, on a connection of the test's, so the interleaving is
exact.
"""

from __future__ import annotations

import datetime as dt
import threading

from sqlalchemy.exc import DBAPIError

from reliable import Reliability, outbox
from reliable.guard.db_errors import is_deadlock
from reliable.stores.sql import SqlStore
from reliable.sweeper.claim import still_claimed
from tests.lock_waits import session_id, waiting
from tests.sweeper.helpers import T0, add_stub, candidate
from tests.waiting import wait_until

GROUPS = ("audit", "billing")


def test_a_record_beside_a_guard_confirming_one_group_of_its_message_waits_instead_of_deadlocking(
    rel: Reliability,
) -> None:
    if rel.engine.dialect.name == "sqlite":
        return  # one writer at a time: no row locks to order
    until = T0 + dt.timedelta(minutes=5)
    add_stub(rel, "m", groups=GROUPS, resend_at=until)  # both groups' rows claimed by one sweeper
    rows = [candidate(consumer_group=g, message_id="m") for g in GROUPS]
    store = SqlStore(rel.engine)
    errors: list[BaseException] = []
    ours: list[set[tuple[str, str]]] = []
    sweeper_session: list[int] = []

    def record() -> None:
        try:
            with outbox.read_committed(rel.engine) as conn:
                sweeper_session.append(session_id(conn))
                ours.append(still_claimed(conn, rows, until))
        except BaseException as exc:  # reported to the test below
            errors.append(exc)

    def sweeper_waits() -> bool:
        return waiting(rel.engine, sweeper_session, "%message_inbox%")

    sweeper = threading.Thread(target=record, name="record", daemon=True)
    with rel.engine.connect() as guard:
        with guard.begin():
            store.no_gap_locks(guard)  # the guard's transaction, as it runs one
            # the guard: billing's row locked …
            assert set(store.lock_inbox(guard, "billing", ["m"])) == {"m"}
            sweeper.start()
            wait_until(lambda: sweeper_session, what="the sweeper's session")
            wait_until(sweeper_waits, what="the record waiting for the guard's row")
            # … then confirmed (a deadlock here, or in the record, was the defect)
            try:
                confirmed, _ = store.confirm(guard, "billing", ["m"], T0)
            except DBAPIError as exc:
                assert not is_deadlock(exc), f"the guard was rolled back to break a deadlock: {exc!r}"
                raise
            assert confirmed == 1
        sweeper.join(60)
    assert not sweeper.is_alive()
    assert errors == []
    # billing's row was confirmed meanwhile: the record writes its verdict on audit's alone
    assert ours == [{("audit", "m")}]
