"""``stubs revive|void|retire`` beside a guard confirming the same message for another group.

A person revives (or voids) group billing's row of a message while a consumer of group audit confirms the
same message. The guard locks audit's inbox row, confirms it, then settles the stub (it locks the stub and
reads the other groups' rows). ``revive``/``void`` changed billing's row and then derived the stub's status
from every group's row:

* on MariaDB at InnoDB's default REPEATABLE READ (the guard runs at READ COMMITTED) that derivation is a
  locking read: the stub locked, then audit's row share-locked — the reverse of the guard's order, so the two
  deadlocked and one was rolled back (the operator's command failed, or the consumer's transaction, whose
  handler then ran again);
* on PostgreSQL it read audit's row as last committed, before the guard's confirm: a revive left the stub
  DEAD with no group dead (``stubs list`` and the DEAD notices kept calling it given up), a void left it
  PENDING with every group closed.

The guard's side is its statements, in its order and at its isolation, on a connection of the test's, so the
interleaving is exact: audit's row locked and confirmed; then the operator's command, until it waits or
ends; then the guard's settle (the exact step: the open stub locked, then settled) and its commit.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Connection, exists, select, update

from reliable import Reliability
from reliable.models import MessageInbox, MessageStub, utcnow
from reliable.sweeper import retire_group, revive, revive_group, void
from reliable.types import StubStatus
from tests.lock_waits import ThreadSessions, waiting
from tests.sweeper.helpers import add_stub, clean, get_inbox, get_stub
from tests.waiting import wait_until

OPERATOR_THREAD = "resolve-operator"
OPEN = (StubStatus.PENDING, StubStatus.DEAD)


@pytest.fixture
def srv(server_url: str) -> Iterator[Reliability]:
    r = Reliability(server_url, redis_url="")
    clean(r.engine)
    yield r
    r.close()


def _guard_confirms(conn: Connection, group: str, message_id: str) -> None:
    """The guard's first steps: the transaction at READ COMMITTED (MariaDB), its group's row locked and
    confirmed."""
    if conn.dialect.name in ("mysql", "mariadb"):
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
    row = MessageInbox.__table__.c
    mine = (row.consumer_group == group, row.message_id == message_id)
    conn.execute(select(row.status).where(*mine).with_for_update()).one()
    conn.execute(update(MessageInbox).where(*mine).values(status=StubStatus.CONFIRMED, confirmed_at=utcnow()))


def _guard_settles(conn: Connection, group: str, message_id: str) -> None:
    """The guard's exact settle step: the open stub locked, then CONFIRMED unless another group's row is
    still open."""
    s, i = MessageStub.__table__.c, MessageInbox.__table__.c
    conn.execute(
        select(s.message_id).where(s.message_id == message_id, s.status.in_(OPEN)).with_for_update()
    ).all()
    others_open = exists().where(i.message_id == s.message_id, i.consumer_group != group, i.status.in_(OPEN))
    conn.execute(
        update(MessageStub)
        .where(s.message_id == message_id, s.status.in_(OPEN), ~others_open)
        .values(status=StubStatus.CONFIRMED, confirmed_at=utcnow())
    )


def _beside_a_confirm(
    srv: Reliability, action: Callable[[], int], *, settled_first: bool
) -> list[BaseException]:
    """Runs ``action`` (the operator's command) while the guard confirms audit's row of "m" — after the
    guard's settle step (``settled_first``) or before it; returns what failed on either side."""
    errors: list[BaseException] = []
    sessions = ThreadSessions(srv.engine, OPERATOR_THREAD)

    def operate() -> None:
        try:
            action()
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    operator = threading.Thread(target=operate, name=OPERATOR_THREAD, daemon=True)
    try:
        with srv.engine.connect() as guard:
            try:
                with guard.begin():
                    _guard_confirms(guard, "audit", "m")
                    if settled_first:
                        _guard_settles(guard, "audit", "m")
                    operator.start()
                    wait_until(
                        lambda: not operator.is_alive() or waiting(srv.engine, sessions.snapshot()),
                        what="the operator's command to end or wait for the guard",
                    )
                    if not settled_first:
                        _guard_settles(guard, "audit", "m")
            except Exception as exc:  # the guard's transaction rolled back (a deadlock): reported below
                errors.append(exc)
        operator.join(60)
        assert not operator.is_alive()
    finally:
        sessions.close()
    return errors


@pytest.mark.parametrize("settled_first", [False, True], ids=["settle-after", "settle-before"])
@pytest.mark.parametrize("how", ["by-id", "all-dead"])
def test_reviving_a_group_while_another_confirms_the_message_derives_pending(
    srv: Reliability, settled_first: bool, how: str
) -> None:
    """``stubs revive ID --group billing``, or ``stubs revive --group billing --all-dead``."""
    # both groups gave up on a copy that never arrived; audit's copy arrives now (the guard confirms a DEAD
    # row without failed attempts), billing's is revived by hand
    add_stub(srv, "m", groups=["billing", "audit"], status=StubStatus.DEAD, resend_at=None)

    def revive_billing() -> int:
        if how == "all-dead":
            return revive_group(srv.engine, "billing", now=utcnow()).revived
        return revive(srv.engine, ["m"], now=utcnow(), group="billing")

    errors = _beside_a_confirm(srv, revive_billing, settled_first=settled_first)
    assert errors == []
    assert get_inbox(srv, "m", "billing").status is StubStatus.PENDING
    assert get_inbox(srv, "m", "audit").status is StubStatus.CONFIRMED
    assert get_stub(srv, "m").status is StubStatus.PENDING  # no group is DEAD; billing is owed


@pytest.mark.parametrize("settled_first", [False, True], ids=["settle-after", "settle-before"])
@pytest.mark.parametrize("how", ["void", "retire"])
def test_voiding_a_group_while_the_other_confirms_the_message_settles_it(
    srv: Reliability, settled_first: bool, how: str
) -> None:
    """``stubs void ID --group billing``, or ``stubs retire billing`` (the same rows, walked in batches)."""
    add_stub(srv, "m", groups=["billing", "audit"], resend_at=utcnow() + dt.timedelta(hours=1))

    def close() -> int:
        if how == "retire":
            return retire_group(srv.engine, "billing", now=utcnow())
        return void(srv.engine, ["m"], now=utcnow(), group="billing")

    errors = _beside_a_confirm(srv, close, settled_first=settled_first)
    assert errors == []
    assert get_inbox(srv, "m", "billing").status is StubStatus.VOIDED
    assert get_inbox(srv, "m", "audit").status is StubStatus.CONFIRMED
    stub = get_stub(srv, "m")
    assert stub.status is StubStatus.CONFIRMED  # nothing is owed any more
    assert stub.confirmed_at is not None
