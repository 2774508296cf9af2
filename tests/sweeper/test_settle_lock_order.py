"""The sweeper's settle step beside a guard confirming the same message (MariaDB's locking subqueries).

A guard confirming a group's row locks that inbox row, then the stub it settles. The sweeper's settle slice
(every round, after its resends) ran ``UPDATE message_stub … WHERE NOT EXISTS (open inbox rows)``: on
InnoDB that locks the stub and then share-locks the inbox rows it reads — the other order — so the two
deadlocked and the sweep round failed before telling anyone of DEAD rows or stalls, every round while the
consumers were busy (seen with async consumers healing a broker's power cut, tests/adapters). The sweeper
settles in ``outbox.read_committed``, where those subqueries read a snapshot and lock nothing. The guard's
side here is its statements in its order, on a connection of the test's, so the interleaving is exact.
"""

from __future__ import annotations

import datetime as dt
import threading

from sqlalchemy import insert, select, text, update

from reliable import Reliability, outbox
from reliable.models import MessageInbox, MessageStub, utcnow
from reliable.types import StubStatus
from tests.lock_waits import session_id, waiting
from tests.waiting import wait_until


def test_a_settle_slice_beside_a_guards_confirm_never_deadlocks(rel: Reliability) -> None:
    if rel.engine.dialect.name == "sqlite":
        return  # one writer at a time: no row locks to order
    now = utcnow()
    with rel.engine.begin() as conn:
        conn.execute(
            insert(MessageStub),
            [
                {
                    "message_id": "m-1",
                    "topic": "T",
                    "content": b"{}",
                    "resend_at": now - dt.timedelta(seconds=5),
                }
            ],
        )
        conn.execute(
            insert(MessageInbox),
            [
                {"consumer_group": g, "message_id": "m-1", "status": StubStatus.PENDING}
                for g in ("audit", "billing")
            ],
        )
        conn.execute(
            update(MessageInbox)
            .where(MessageInbox.consumer_group == "billing")
            .values(status=StubStatus.CONFIRMED)
        )
    errors: list[BaseException] = []
    sweeper_session: list[int] = []

    def settle() -> None:
        try:
            with outbox.read_committed(rel.engine) as conn:  # as the sweeper settles
                sweeper_session.append(session_id(conn))
                outbox.settle_slice(conn, now, None, 100)
        except BaseException as exc:  # reported to the test below
            errors.append(exc)

    with rel.engine.connect() as guard:
        with guard.begin():
            # the guard: audit's inbox row locked and confirmed …
            guard.execute(
                select(MessageInbox.status)
                .where(MessageInbox.consumer_group == "audit", MessageInbox.message_id == "m-1")
                .with_for_update()
            ).one()
            guard.execute(
                update(MessageInbox)
                .where(MessageInbox.consumer_group == "audit", MessageInbox.message_id == "m-1")
                .values(status=StubStatus.CONFIRMED)
            )
            sweeper = threading.Thread(target=settle, name="settle")
            sweeper.start()
            wait_until(lambda: sweeper_session, what="the sweeper's session")

            def sweeper_settled_or_waits() -> bool:
                if not sweeper.is_alive():
                    return True
                return waiting(rel.engine, sweeper_session, "%message_inbox%") or waiting(
                    rel.engine, sweeper_session, "%message_stub%"
                )

            # the settle has read what it settles, and either finished (a snapshot: audit still open) or
            # locked what it could and waits for the guard
            wait_until(sweeper_settled_or_waits, what="the settle done or waiting for the guard's row")
            # … then the stub it settles (a deadlock here, or in the sweeper, was the defect)
            guard.execute(
                update(MessageStub)
                .where(MessageStub.message_id == "m-1", MessageStub.status == StubStatus.PENDING)
                .values(status=StubStatus.CONFIRMED, confirmed_at=now)
            )
        sweeper.join(60)
        assert not sweeper.is_alive()
    assert errors == []
    with rel.engine.connect() as conn:
        assert conn.execute(
            text("SELECT status FROM message_stub WHERE message_id = 'm-1'")
        ).scalar_one() == ("CONFIRMED")
