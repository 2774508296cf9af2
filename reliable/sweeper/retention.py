"""Log retention and reviving dead stubs.

Retention: ``message_log`` rows older than ``log_retention`` are deleted in batches — but never a row whose
stub is still ``PENDING`` or ``DEAD``. Those rows are the evidence the sweeper relies on: without them a
received-but-unconfirmed stub would look never received and be re-sent, and a revived DEAD stub would lose
its history. The consumer's position survives the purge in ``consume_progress``. ``log_retention = 0`` is
the seed's "delete the log on success": every round deletes the log of every confirmed (or voided) stub.
Rows with no stub at all (a producer without stubs) age out like confirmed ones.

Revive: a person fixed the cause of a ``DEAD`` stub and wants it delivered. The stub goes back to
``PENDING`` with ``send_count = 0`` (a full new budget: the old attempts were spent against a cause that no
longer exists; their number stays readable in ``last_error``), ``resend_at = now`` (due in the next round)
and its owed notifications are cleared, so a second death is reported again. Its ``queue_id/queue_offset``
are kept: the stub died because its group had passed that offset (or it was stuck), so it is due at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import Engine, delete, exists, select, update

from reliable.errors import InvalidStubStateError, StubNotFoundError
from reliable.sweeper.selection import log as log_t
from reliable.sweeper.selection import notif, stub
from reliable.types import StubStatus

#: statuses whose log rows are kept whatever their age
PROTECTED = (StubStatus.PENDING, StubStatus.DEAD)


def purge_logs(engine: Engine, *, now: dt.datetime, retention: dt.timedelta, batch: int = 5000) -> int:
    """Delete old log rows of settled stubs; returns how many. One short transaction per batch."""
    cutoff = now - retention
    protected = exists().where(stub.c.message_id == log_t.c.message_id, stub.c.status.in_(PROTECTED))
    find = select(log_t.c.id).where(log_t.c.received_at <= cutoff, ~protected).limit(batch)
    total = 0
    while True:
        with engine.begin() as conn:
            ids = list(conn.execute(find).scalars())
            if not ids:
                return total
            # re-check protection in the DELETE itself: a stub cannot go back to PENDING except by revive,
            # which only takes DEAD stubs (protected), so the check above cannot be outdated — but a second
            # condition here costs nothing and keeps the invariant local.
            conn.execute(delete(log_t).where(log_t.c.id.in_(ids), ~protected))
        total += len(ids)
        if len(ids) < batch:
            return total


def revive(engine: Engine, message_ids: Sequence[str], *, now: dt.datetime) -> int:
    """Put DEAD stubs back to PENDING (all or nothing); unknown id or other status raises."""
    ids = list(dict.fromkeys(message_ids))
    if not ids:
        return 0
    with engine.begin() as conn:
        rows = conn.execute(
            select(stub.c.message_id, stub.c.status, stub.c.send_count).where(stub.c.message_id.in_(ids))
        ).all()
        found = {r.message_id: r for r in rows}
        missing = [i for i in ids if i not in found]
        if missing:
            raise StubNotFoundError(f"no such stub: {', '.join(missing)}")
        wrong = [f"{i} is {found[i].status}" for i in ids if found[i].status != StubStatus.DEAD]
        if wrong:
            raise InvalidStubStateError(f"only DEAD stubs can be revived: {'; '.join(wrong)}")
        for r in rows:
            conn.execute(
                update(stub)
                .where(stub.c.message_id == r.message_id, stub.c.status == StubStatus.DEAD)
                .values(
                    status=StubStatus.PENDING,
                    send_count=0,
                    resend_at=now,
                    updated_at=now,
                    last_error=f"revived at {now.isoformat()} after {r.send_count} send(s)",
                )
            )
        conn.execute(delete(notif).where(notif.c.message_id.in_(ids)))
    return len(ids)
