"""Log retention and reviving dead rows.

Retention: ``message_log`` rows older than ``log_retention`` are deleted in batches — but never a row whose
group's inbox row is still ``PENDING`` or ``DEAD``. Those rows are the evidence the sweeper relies on:
without them a received-but-unconfirmed row would look never received and be re-sent, and a revived DEAD row
would lose its history. The consumer's position survives the purge in ``consume_progress``.
``log_retention = 0`` is the seed's "delete the log on success": every round deletes the log of every
confirmed (or voided) row. Rows of a group with no inbox row age out like confirmed ones.

Revive: a person fixed the cause of a ``DEAD`` row and wants it delivered. Each DEAD inbox row of the message
(or of one group) goes back to ``PENDING`` through :func:`reliable.outbox.revive` — a full new budget, due
now, attempts 0 — and the stub's status is derived again; the owed notifications of those (message, group)
pairs are cleared, so a second death is reported again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import Engine, and_, delete, exists, select

from reliable import outbox
from reliable.errors import InvalidStubStateError, StubNotFoundError
from reliable.sweeper.selection import inbox, notif, stub
from reliable.sweeper.selection import log as log_t
from reliable.types import StubStatus

#: statuses whose log rows are kept whatever their age
PROTECTED = (StubStatus.PENDING, StubStatus.DEAD)


def purge_logs(engine: Engine, *, now: dt.datetime, retention: dt.timedelta, batch: int = 5000) -> int:
    """Delete old log rows of settled inbox rows; returns how many. One short transaction per batch."""
    cutoff = now - retention
    protected = exists().where(
        inbox.c.message_id == log_t.c.message_id,
        inbox.c.consumer_group == log_t.c.consumer_group,
        inbox.c.status.in_(PROTECTED),
    )
    find = select(log_t.c.id).where(log_t.c.received_at <= cutoff, ~protected).limit(batch)
    total = 0
    while True:
        with engine.begin() as conn:
            ids = list(conn.execute(find).scalars())
            if not ids:
                return total
            # re-check protection in the DELETE itself: a row cannot go back to PENDING except by revive,
            # which only takes DEAD rows (protected) — but a second condition here keeps the invariant local.
            conn.execute(delete(log_t).where(log_t.c.id.in_(ids), ~protected))
        total += len(ids)
        if len(ids) < batch:
            return total


def revive(engine: Engine, message_ids: Sequence[str], *, now: dt.datetime, group: str | None = None) -> int:
    """Put the DEAD inbox rows of ``message_ids`` (of ``group`` only, when given) back to PENDING, all or
    nothing; an unknown id, or one without a DEAD row, raises. Returns the number of rows revived."""
    ids = list(dict.fromkeys(message_ids))
    if not ids:
        return 0
    with engine.begin() as conn:
        known = set(conn.execute(select(stub.c.message_id).where(stub.c.message_id.in_(ids))).scalars())
        missing = [i for i in ids if i not in known]
        if missing:
            raise StubNotFoundError(f"no such stub: {', '.join(missing)}")
        dead = select(inbox.c.message_id).where(
            inbox.c.message_id.in_(ids), inbox.c.status == StubStatus.DEAD
        )
        if group is not None:
            dead = dead.where(inbox.c.consumer_group == group)
        with_dead = set(conn.execute(dead).scalars())
        wrong = [i for i in ids if i not in with_dead]
        if wrong:
            whose = f"of group {group} " if group is not None else ""
            raise InvalidStubStateError(
                f"only DEAD rows can be revived; no DEAD row {whose}for: {', '.join(wrong)}"
            )
        revived = 0
        for message_id in ids:
            groups = list(
                conn.execute(
                    select(inbox.c.consumer_group).where(
                        inbox.c.message_id == message_id,
                        inbox.c.status == StubStatus.DEAD,
                        *([inbox.c.consumer_group == group] if group is not None else []),
                    )
                ).scalars()
            )
            revived += outbox.revive(conn, message_id, now, group)
            for g in groups:
                conn.execute(
                    delete(notif).where(and_(notif.c.message_id == message_id, notif.c.consumer_group == g))
                )
    return revived
