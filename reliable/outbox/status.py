"""Status transitions: the stub's status from its inbox rows, settling, giving up, reviving, voiding."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    and_,
    bindparam,
    case,
    exists,
    func,
    or_,
    select,
    update,
)

from reliable.models import status_literal
from reliable.outbox.keys import by_primary_key, columns_in
from reliable.outbox.tables import OPEN, inbox, stub
from reliable.types import StubStatus


def _derived(now: dt.datetime) -> dict[str, Any]:
    """SET clause: the stub's status from its inbox rows (callers filter stubs that have inbox rows)."""
    of_stub = inbox.c.message_id == stub.c.message_id
    dead = exists().where(of_stub, inbox.c.status == StubStatus.DEAD)
    open_ = exists().where(of_stub, inbox.c.status.in_(OPEN))
    status = case(
        (dead, StubStatus.DEAD.value), (open_, StubStatus.PENDING.value), else_=StubStatus.CONFIRMED.value
    )
    confirmed_at = case((~open_, func.coalesce(stub.c.confirmed_at, now)), else_=None)
    return {"status": status, "confirmed_at": confirmed_at, "updated_at": now}


def derive_status(conn: Connection, message_ids: Sequence[str], now: dt.datetime) -> None:
    """Set each stub's status from its inbox rows (a voided stub or one without inbox rows stays as is)."""
    if not message_ids:
        return
    conn.execute(
        update(stub)
        .where(
            stub.c.message_id.in_(list(message_ids)),
            stub.c.status != StubStatus.VOIDED,
            exists().where(inbox.c.message_id == stub.c.message_id),
        )
        .values(**_derived(now))
    )


def settle(conn: Connection, now: dt.datetime) -> int:
    """PENDING stubs whose every group confirmed (concurrent last confirms both missed it) → CONFIRMED.

    Looks at every PENDING stub: its cost grows with them. The sweeper walks them in slices instead
    (:func:`settle_slice`)."""
    return _settle_where(conn, now, stub.c.status == status_literal(StubStatus.PENDING))


#: where a :func:`settle_slice` walk stopped: the last stub's (resend_at, message_id); ``None``: the start
SettleCursor = tuple[dt.datetime, str] | None


def settle_slice(conn: Connection, now: dt.datetime, after: SettleCursor, limit: int) -> SettleCursor:
    """:func:`settle` for the next ``limit`` PENDING stubs in ``(resend_at, message_id)`` order after
    ``after``: an ordered range scan of ``ix_message_stub_status_resend_at`` that stops at ``limit``, so a
    sweep round's cost does not grow with the table. Returns where to go on (``None``: the walk reached
    the end and starts over). A PENDING stub without ``resend_at`` (not staged by the producer) is left out.

    On MariaDB/MySQL run it in :func:`read_committed`, as the sweeper does: at REPEATABLE READ the
    ``UPDATE``'s subqueries share-lock the inbox rows after the stub, against a guard's order.

    The ids are read without a lock, then the stubs updated through the primary key, in id order, as a
    guard's settle locks them (:func:`reliable.outbox.keys.by_primary_key`). By the update most of the
    slice's stubs have often been settled by their guards, and MariaDB then answered ``status = 'PENDING'
    AND message_id IN (…)`` through ``ix_message_stub_status_resend_at``: each stub's entry there locked,
    then the stub — the reverse of a guard settling it (the stub by key, then the entry its status change
    moves) — and the two deadlocked (tests/sweeper/test_settle_index_lock_order.py).
    """
    q = select(stub.c.resend_at, stub.c.message_id).where(
        stub.c.status == status_literal(StubStatus.PENDING), stub.c.resend_at.is_not(None)
    )
    if after is not None:
        q = q.where(
            or_(
                stub.c.resend_at > after[0],
                and_(stub.c.resend_at == after[0], stub.c.message_id > after[1]),
            )
        )
    rows = conn.execute(q.order_by(stub.c.resend_at, stub.c.message_id).limit(limit)).all()
    if rows:
        ids = sorted(r[1] for r in rows)
        which = and_(stub.c.status == StubStatus.PENDING, stub.c.message_id.in_(ids))
        _settle_where(conn, now, which, by_key=True)
    if len(rows) < limit:
        return None
    return rows[-1][0], rows[-1][1]


@contextlib.contextmanager
def read_committed(engine: Engine) -> Iterator[Connection]:
    """A transaction (committed on a clean exit) that runs at READ COMMITTED on MariaDB/MySQL too, as the
    guard's and the purge's do, and as every transaction does on PostgreSQL, where the sweeper's locking was
    designed and tested. The sweeper's claim, record, settle and tell transactions use it. At InnoDB's
    default REPEATABLE READ, on a busy two-group topic (2026-11-29), they deadlocked with consumers and with
    each other — a round in two failed before it told, notified and purged:

    * a subquery of an ``UPDATE`` (the settle's ``NOT EXISTS (SELECT … FROM message_inbox …)``) is a locking
      read there: the stub locked, then its inbox rows share-locked — the reverse of the guard's order (its
      group's inbox row, then the stub);
    * the claim's and the record's lock reads take next-key locks, and moving a claimed row's ``resend_at``
      inserts into the ``(status, resend_at)`` index, into a gap another sweeper's claim or a consumer's
      confirmation had locked.

    At READ COMMITTED the subqueries read committed rows without locking them and locks are on rows, not
    gaps; a row locked ``FOR UPDATE`` is still read in its newest committed version."""
    with engine.begin() as conn:
        if conn.dialect.name in ("mysql", "mariadb"):  # before the transaction's first statement
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        yield conn


def _settle_where(
    conn: Connection, now: dt.datetime, which: ColumnElement[bool], *, by_key: bool = False
) -> int:
    """Settle the stubs ``which`` selects; ``by_key``: it names them by id, read them by primary key."""
    of_stub = inbox.c.message_id == stub.c.message_id
    settled = (
        update(stub)
        .where(
            which,
            exists().where(of_stub),
            ~exists().where(of_stub, inbox.c.status.in_(OPEN)),
        )
        .values(status=StubStatus.CONFIRMED.value, confirmed_at=now, updated_at=now, last_error=None)
    )
    result = conn.execute(by_primary_key(settled, stub) if by_key else settled)
    return int(result.rowcount)


def mark_dead(
    conn: Connection,
    message_id: str,
    group: str,
    now: dt.datetime,
    error: str | None,
    *,
    spent: int | None = None,
) -> bool:
    """Group ``group`` gave up on ``message_id`` — the sweeper, its resends exhausted; the guard, its handler
    failed ``max_attempts`` times or at the broker's last delivery: its PENDING inbox row → DEAD, and the
    stub's status derived.

    ``spent`` (the guard's): the row's ``attempts`` becomes at least that budget, so the guard answers any
    later copy ``gave_up`` also when the broker's retries ran out before the budget did — ``attempts`` is
    what tells the guard's give-up from the sweeper's (a late copy of a message that never arrived runs)."""
    values: dict[str, object] = {
        "status": StubStatus.DEAD.value,
        "resend_at": None,
        "updated_at": now,
        "last_error": error,
    }
    if spent is not None:
        values["attempts"] = case((inbox.c.attempts < spent, spent), else_=inbox.c.attempts)
    result = conn.execute(
        update(inbox)
        .where(
            inbox.c.message_id == message_id,
            inbox.c.consumer_group == group,
            inbox.c.status == StubStatus.PENDING,
        )
        .values(values)
    )
    derive_status(conn, [message_id], now)
    return bool(result.rowcount)


def mark_dead_rows(
    conn: Connection, rows: Sequence[tuple[str, str, str]], now: dt.datetime
) -> set[tuple[str, str]]:
    """:func:`mark_dead` for a batch of ``(message_id, group, error)`` — the sweeper's give-ups of a round —
    in three statements, not two per row; returns the ``(message_id, group)`` it set DEAD.

    The rows still ``PENDING`` are locked first (in the guard's order: message id, then group), so the
    batched ``UPDATE`` changes exactly those; a row confirmed, voided or given up meanwhile is left as it is
    and not returned. One at a time, 5 000 give-ups took 25 s on PostgreSQL (this machine, 2026-11-29;
    docs/benchmarks/sweeper.md)."""
    if not rows:
        return set()
    errors = {(m, g): e for m, g, e in rows}
    pending = (
        select(inbox.c.message_id, inbox.c.consumer_group)
        .where(
            columns_in(conn, inbox.c.message_id, inbox.c.consumer_group, sorted(errors)),
            inbox.c.status == status_literal(StubStatus.PENDING),
        )
        .order_by(inbox.c.message_id, inbox.c.consumer_group)
    )
    if conn.dialect.name != "sqlite":  # SQLite: the transaction's write lock
        pending = by_primary_key(pending.with_for_update(), inbox)  # the guard's order (keys.py)
    dead = [(r.message_id, r.consumer_group) for r in conn.execute(pending)]
    if not dead:
        return set()
    dead_rows = (
        update(inbox)
        .where(
            inbox.c.message_id == bindparam("b_message_id"),
            inbox.c.consumer_group == bindparam("b_group"),
            inbox.c.status == StubStatus.PENDING,
        )
        .values(status=StubStatus.DEAD.value, resend_at=None, updated_at=now, last_error=bindparam("b_error"))
    )
    conn.execute(
        by_primary_key(dead_rows, inbox),
        [{"b_message_id": m, "b_group": g, "b_error": errors[(m, g)]} for m, g in dead],
    )
    _stubs_dead(conn, sorted({m for m, _ in dead}), now)
    return set(dead)


def _stubs_dead(conn: Connection, message_ids: Sequence[str], now: dt.datetime) -> None:
    """The stubs of rows this transaction has just set DEAD: ``DEAD`` (what :func:`derive_status` would
    derive — a DEAD row outranks every other — without reading the other groups' rows). On InnoDB that read
    is a locking one: the stub locked, then every other group's inbox row of the message share-locked — the
    reverse of the guard's order (its group's row, then the stub), so a consumer of another group confirming
    the message, or a second sweeper giving up another group of it, deadlocked with the give-up. Locks the
    stubs by primary key in id order, as the guard's settle does; a voided stub stays as it is."""
    conn.execute(
        update(stub)
        .where(stub.c.message_id.in_(list(message_ids)), stub.c.status != StubStatus.VOIDED)
        .values(status=StubStatus.DEAD.value, confirmed_at=None, updated_at=now)
    )


def revive(conn: Connection, message_id: str, now: dt.datetime, group: str | None = None) -> int:
    """DEAD inbox rows of ``message_id`` (one group's or all) → PENDING, due now, attempts and resends 0."""
    cond = [inbox.c.message_id == message_id, inbox.c.status == StubStatus.DEAD]
    if group is not None:
        cond.append(inbox.c.consumer_group == group)
    result = conn.execute(update(inbox).where(*cond).values(_revived(now)))
    derive_status(conn, [message_id], now)
    return int(result.rowcount)


def _revived(now: dt.datetime) -> dict[str, Any]:
    """A revived row's columns: PENDING, due now, a new send and attempt budget, no error."""
    return {
        "status": StubStatus.PENDING.value,
        "attempts": 0,
        "resend_count": 0,
        "resend_at": now,
        "last_error": None,
        "updated_at": now,
    }


def revive_rows(conn: Connection, message_ids: Sequence[str], group: str, now: dt.datetime) -> int:
    """:func:`revive` of one group's DEAD rows of ``message_ids`` in two statements (the rows, then the stubs'
    status derived), not two per message; returns the rows changed."""
    if not message_ids:
        return 0
    result = conn.execute(
        update(inbox)
        .where(
            inbox.c.consumer_group == group,
            inbox.c.message_id.in_(list(message_ids)),
            inbox.c.status == StubStatus.DEAD,
        )
        .values(_revived(now))
    )
    derive_status(conn, message_ids, now)
    return int(result.rowcount)


class Locked(NamedTuple):
    """What :func:`lock_messages` locked: every group's inbox row ``(message_id, group, status)`` in lock
    order, and the ids that have a stub."""

    rows: list[tuple[str, str, StubStatus]]
    stubs: set[str]


def lock_messages(conn: Connection, message_ids: Sequence[str]) -> Locked:
    """Lock the messages a person revives or voids, in the guard's order: every group's inbox row of them by
    message id, then group, then their stubs by id — before their status is read or derived.

    Reviving or voiding one group's row derives the stub's status from *every* group's row. Unlocked, a
    guard confirming another group's row of the message at that moment was missed: on PostgreSQL the
    derivation read that row as last committed (a revive left the stub ``DEAD`` with no group dead, a void
    left it ``PENDING`` with every group closed); on MariaDB's REPEATABLE READ the derivation's subqueries
    locked the stub, then that row — the guard's order reversed — and the two deadlocked. Locked first, the
    one that comes second waits for the other's commit and reads what it wrote. Run it at READ COMMITTED
    (:func:`read_committed`), so the rows read after the wait are the committed ones.

    The rows are found by message id alone, which only the ``(message_id, status)`` index answers; a lock
    read through it locked each row's entry there, then the row — on MariaDB the reverse of a guard
    confirming the row (the row, then the entry its status change moves), and the two deadlocked
    (tests/sweeper/test_inbox_pk_lock_order.py). So the keys are read first without a lock, then the rows
    locked by primary key (:func:`reliable.outbox.keys.by_primary_key`), their status read under the lock.
    Nothing is lost by the split: at READ COMMITTED the one-step read took no gap locks either, so a row
    inserted after it was never locked; a row deleted in between is just not found."""
    ids = sorted(set(message_ids))
    if not ids:
        return Locked([], set())
    stubs = select(stub.c.message_id).where(stub.c.message_id.in_(ids)).order_by(stub.c.message_id)
    rows: Select[Any] = select(inbox.c.message_id, inbox.c.consumer_group, inbox.c.status).order_by(
        inbox.c.message_id, inbox.c.consumer_group
    )
    if conn.dialect.name == "sqlite":  # SQLite: the transaction's write lock
        rows = rows.where(inbox.c.message_id.in_(ids))
    else:
        found_keys = select(inbox.c.message_id, inbox.c.consumer_group).where(inbox.c.message_id.in_(ids))
        pairs = sorted((m, g) for m, g in conn.execute(found_keys))
        where = columns_in(conn, inbox.c.message_id, inbox.c.consumer_group, pairs)  # false() for none
        rows = by_primary_key(rows.where(where).with_for_update(), inbox)
        stubs = stubs.with_for_update()
    found = [(r.message_id, r.consumer_group, StubStatus(r.status)) for r in conn.execute(rows)]
    return Locked(found, set(conn.execute(stubs).scalars()))


def void(conn: Connection, message_id: str, now: dt.datetime) -> int:
    """Cancel a message: a PENDING/DEAD stub and its open inbox rows → VOIDED; returns stubs changed (0/1)."""
    conn.execute(  # inbox rows first: the guard's lock order
        update(inbox)
        .where(inbox.c.message_id == message_id, inbox.c.status.in_(OPEN))
        .values(status=StubStatus.VOIDED, resend_at=None, updated_at=now)
    )
    result = conn.execute(
        update(stub)
        .where(stub.c.message_id == message_id, stub.c.status.in_(OPEN))
        .values(status=StubStatus.VOIDED, resend_at=None, updated_at=now)
    )
    return int(result.rowcount)


def void_rows(conn: Connection, message_ids: Sequence[str], group: str, now: dt.datetime) -> int:
    """Close one group's open (PENDING or DEAD) rows of ``message_ids`` without a delivery: VOIDED, and each
    stub's status derived again (the messages go on for the other groups); returns the rows changed."""
    result = conn.execute(
        update(inbox)
        .where(
            inbox.c.consumer_group == group,
            inbox.c.message_id.in_(list(message_ids)),
            inbox.c.status.in_(OPEN),
        )
        .values(status=StubStatus.VOIDED, resend_at=None, updated_at=now)
    )
    derive_status(conn, message_ids, now)
    return int(result.rowcount)


def stub_status(conn: Connection, message_id: str) -> StubStatus | None:
    """The stub's status, ``None`` when there is no stub."""
    value = conn.execute(select(stub.c.status).where(stub.c.message_id == message_id)).scalar()
    return None if value is None else StubStatus(value)
