"""What a person does with a (message, group) the sweeper gave up on, or with a group that no longer consumes.

The sweeper tells a person when it gives up (a ``DEAD`` row and its notices). The person fixes the cause and
then decides, per message:

* **revive** — deliver it after all: each DEAD row of the message (or of one group) goes back to ``PENDING``
  through :func:`reliable.outbox.revive`, with a full new budget, due now, attempts 0;
* **void** — it must not be processed any more (the business compensated, the group was retired): its open
  rows (``PENDING`` or ``DEAD``) become ``VOIDED`` through :func:`reliable.outbox.void` (the whole message,
  stub included, as ``StubProducer.void`` does) or :func:`reliable.outbox.void_rows` (one group's row; the
  message goes on for the other groups). A guard that still receives it acknowledges it without running the
  handler. A row whose stub is gone can be voided too, though it cannot be revived.

Both are all or nothing over the ids given: an unknown id, or one without a row in the state the action needs,
raises a typed error and nothing changes. Either way the stub's status is derived again and the notification
rows of those (message, group) pairs are deleted, so a later death is reported again and no owed notice is
sent for a row a person already closed. Both run at READ COMMITTED (:func:`reliable.outbox.read_committed`)
and lock the messages in the guard's order before reading them (:func:`reliable.outbox.lock_messages`): a
guard confirming another group's row of the message at that moment is waited for, not deadlocked with or
missed when the stub's status is derived.

**Retiring a group** (:func:`retire_group`): a consumer group taken out of service leaves its open rows
behind, which the sweeper would re-send and then give up on, telling a person about each. Every open row of
the group is voided, in batches of ``batch`` rows per transaction (keyset order on the primary key, so the
walk reads each row once and holds row locks only briefly).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, func, select

from reliable import constants as C
from reliable import outbox
from reliable.errors import InvalidStubStateError, StubNotFoundError
from reliable.outbox.tables import OPEN
from reliable.sweeper.owed import forget
from reliable.sweeper.selection import inbox
from reliable.types import StubStatus


def _groups(locked: outbox.Locked, statuses: Sequence[StubStatus], group: str | None) -> dict[str, list[str]]:
    """message id → the groups whose locked row of it is in one of ``statuses`` (``group``'s only, when
    given)."""
    found: dict[str, list[str]] = {}
    for message_id, consumer_group, status in locked.rows:
        if status in statuses and (group is None or consumer_group == group):
            found.setdefault(message_id, []).append(consumer_group)
    return found


def revive(engine: Engine, message_ids: Sequence[str], *, now: dt.datetime, group: str | None = None) -> int:
    """Put the DEAD inbox rows of ``message_ids`` (of ``group`` only, when given) back to PENDING, all or
    nothing; an unknown id, or one without a DEAD row, raises. Returns the number of rows revived."""
    ids = list(dict.fromkeys(message_ids))
    if not ids:
        return 0
    with outbox.read_committed(engine) as conn:
        locked = outbox.lock_messages(conn, ids)
        missing = [i for i in ids if i not in locked.stubs]
        if missing:
            orphans = {m for m, _, _ in locked.rows}
            hint = (
                f" ({', '.join(i for i in missing if i in orphans)}: group rows without a stub have "
                "nothing to re-send; stage the message again, or void the row)"
                if orphans & set(missing)
                else ""
            )
            raise StubNotFoundError(f"no such stub: {', '.join(missing)}{hint}")
        dead = _groups(locked, [StubStatus.DEAD], group)
        wrong = [i for i in ids if i not in dead]
        if wrong:
            whose = f"of group {group} " if group is not None else ""
            raise InvalidStubStateError(
                f"only DEAD rows can be revived; no DEAD row {whose}for: {', '.join(wrong)}"
            )
        revived = 0
        for message_id in sorted(ids):
            revived += outbox.revive(conn, message_id, now, group)
            forget(conn, [(message_id, g) for g in dead[message_id]])
    return revived


def void(engine: Engine, message_ids: Sequence[str], *, now: dt.datetime, group: str | None = None) -> int:
    """Close the open (PENDING or DEAD) rows of ``message_ids`` without a delivery, all or nothing: every
    group's (the message is cancelled, its stub VOIDED) or ``group``'s only (the stub's status derived
    again). An id without such a row raises — :class:`StubNotFoundError` when the id is unknown altogether.
    Returns the number of rows voided."""
    ids = list(dict.fromkeys(message_ids))
    if not ids:
        return 0
    with outbox.read_committed(engine) as conn:
        locked = outbox.lock_messages(conn, ids)
        open_rows = _groups(locked, OPEN, group)
        wrong = [i for i in ids if i not in open_rows]
        if wrong:
            known = {m for m, _, _ in locked.rows} | locked.stubs
            unknown = [i for i in wrong if i not in known]
            if unknown:
                raise StubNotFoundError(f"no such message: {', '.join(unknown)}")
            whose = f"of group {group} " if group is not None else ""
            raise InvalidStubStateError(
                f"only PENDING or DEAD rows can be voided; no such row {whose}for: {', '.join(wrong)}"
            )
        for message_id in sorted(ids):
            if group is None:
                outbox.void(conn, message_id, now)
            else:
                outbox.void_rows(conn, [message_id], group, now)
            forget(conn, [(message_id, g) for g in open_rows[message_id]])
    return sum(len(groups) for groups in open_rows.values())


def count_open(engine: Engine, group: str) -> int:
    """How many open rows ``group`` has (what :func:`retire_group` would void)."""
    with engine.connect() as conn:
        q = select(func.count()).where(inbox.c.consumer_group == group, inbox.c.status.in_(OPEN))
        return int(conn.execute(q).scalar_one())


def _walk_group(
    engine: Engine,
    group: str,
    statuses: Sequence[StubStatus],
    batch: int,
    step: Callable[[Connection, outbox.Locked], None],
) -> None:
    """``step`` for every message whose row of ``group`` is in one of ``statuses``, ``batch`` messages per
    transaction: keyset order on the primary key (each row read once, row locks held only briefly), each
    batch's messages locked in the guard's order (:func:`reliable.outbox.lock_messages`) at READ COMMITTED
    before ``step`` reads and changes them."""
    if batch <= 0:
        raise ValueError("batch must be > 0")
    after = ""
    while True:
        with outbox.read_committed(engine) as conn:
            ids = list(
                conn.execute(
                    select(inbox.c.message_id)
                    .where(
                        inbox.c.consumer_group == group,
                        inbox.c.message_id > after,
                        inbox.c.status.in_(statuses),
                    )
                    .order_by(inbox.c.message_id)
                    .limit(batch)
                ).scalars()
            )
            if ids:
                step(conn, outbox.lock_messages(conn, ids))
        if len(ids) < batch:
            return
        after = ids[-1]


def retire_group(engine: Engine, group: str, *, now: dt.datetime, batch: int = C.DEFAULT_RETIRE_BATCH) -> int:
    """Void every open row of ``group`` (a group taken out of service), ``batch`` rows per transaction;
    returns the number of rows voided."""
    voided = 0

    def step(conn: Connection, locked: outbox.Locked) -> None:
        nonlocal voided
        mine = sorted(m for m, g, status in locked.rows if g == group and status in OPEN)
        if mine:
            voided += outbox.void_rows(conn, mine, group, now)
            forget(conn, [(m, group) for m in mine])

    _walk_group(engine, group, OPEN, batch, step)
    return voided


@dataclass(frozen=True)
class GroupRevival:
    """What :func:`revive_group` did: ``revived`` rows back to PENDING; ``without_stub`` DEAD rows left as
    they are, their stub gone (nothing to re-send: stage the message again, or void the row)."""

    revived: int
    without_stub: int


def revive_group(
    engine: Engine, group: str, *, now: dt.datetime, batch: int = C.DEFAULT_REVIVE_BATCH
) -> GroupRevival:
    """Every DEAD row of ``group`` back to PENDING as :func:`revive` does by id (a full new budget, due now,
    the stub's status derived, the notices of those rows forgotten), ``batch`` rows per transaction in a few
    statements each. After an outage a group can have thousands of DEAD rows; naming each was the only way.
    A DEAD row whose stub is gone is left DEAD and counted (revive by id refuses it)."""
    revived = without_stub = 0

    def step(conn: Connection, locked: outbox.Locked) -> None:
        nonlocal revived, without_stub
        dead = [m for m, g, status in locked.rows if g == group and status is StubStatus.DEAD]
        alive = sorted(m for m in dead if m in locked.stubs)
        without_stub += len(dead) - len(alive)
        if alive:
            revived += outbox.revive_rows(conn, alive, group, now)
            forget(conn, [(m, group) for m in alive])

    _walk_group(engine, group, [StubStatus.DEAD], batch, step)
    return GroupRevival(revived, without_stub)
