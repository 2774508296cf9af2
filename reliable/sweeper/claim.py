"""Claiming due inbox rows so that several sweepers never send the same (group, message) in one round.

Every claim starts with the selection statement plus a row-locking clause::

    SELECT <due_statement> FOR UPDATE [OF message_inbox] SKIP LOCKED

Rows another sweeper has locked are skipped, not waited on. The sweeper claims, sends, then records
(``Sweeper(claim_ttl_s=…)``, default ``DEFAULT_CLAIM_TTL_S``):

1. **claim** — a short transaction selects-and-locks the due rows, moves their ``resend_at`` to the claim's
   end (``until``: now + the claim window), reads what their verdicts need from the database
   (:func:`reliable.sweeper.triage.observe`) and commits. The rows are no longer due, so another sweeper's
   selection does not see them;
2. **probe and send** — with no transaction open: the broker's offsets of the rows' queues are asked and
   the rows judged (:mod:`.triage`), the ones to re-send sent. No row lock is held during broker calls, so a
   consumer confirming one of the rows (DESIGN.md §2 step 3 locks it) never waits for the broker. The former
   default held the claim's row locks through the batch's sends, and until 2026-11-29 through its probes: a
   slow broker stalled consumers exactly when the sweeper mattered;
3. **record** — a second short transaction locks the batch's rows in the guard's order
   (:func:`still_claimed`) and writes the verdicts and the outcomes, conditionally: only a row still
   ``PENDING`` and still carrying ``resend_at = until`` is held, given up (with its notice), counted in a
   never-consumed alarm, or takes the send's due time and error; on any other row (confirmed meanwhile, or
   claimed again by another sweeper once this claim ended) the send is history only
   (:func:`reliable.outbox.record_sends`) and the verdict is dropped. Rows claimed but not sent (a stop, an
   outage pause, the claim's last fifth) are released to the next round.

A sweeper killed between claim and record leaves its rows claimed: due again when the claim window ends.
No send starts in the claim's last fifth (``CLAIM_SEND_SHARE_REMAINING``), so a slow batch does not run
past its claim into another sweeper's.

Per backend:

* PostgreSQL, MariaDB 10.6+, MySQL 8.0.1+: ``FOR UPDATE SKIP LOCKED`` (:attr:`LockMode.SKIP_LOCKED`).
* older MariaDB/MySQL: plain ``FOR UPDATE`` (:attr:`LockMode.BLOCKING`): still correct — the second
  sweeper waits for the first to commit and then no longer sees its rows — only slower.
* SQLite (:attr:`LockMode.SERIAL`) has no row locks. :func:`reliable.facade.make_engine` opens every
  transaction with ``BEGIN IMMEDIATE``, which takes the database write lock before the SELECT, so claim
  transactions are serialised and select-then-update is atomic. Two sweepers on one SQLite file therefore
  do not double-send; the write lock is held for the claim and the record, not during sends. Still, run
  one sweeper per SQLite database (docs/sweeper.md).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, Select, and_, case, select, update

from reliable.outbox.keys import by_primary_key, columns_in
from reliable.sweeper.selection import Candidate, inbox
from reliable.types import StubStatus


class LockMode(enum.Enum):
    SKIP_LOCKED = "skip_locked"
    BLOCKING = "blocking"
    SERIAL = "serial"


def lock_mode(conn: Connection) -> LockMode:
    """The strongest claim the connected server supports."""
    dialect = conn.dialect
    if dialect.name == "sqlite":
        return LockMode.SERIAL
    if dialect.name == "postgresql":
        return LockMode.SKIP_LOCKED  # since 9.5
    version = tuple(dialect.server_version_info or ())
    if getattr(dialect, "is_mariadb", False):
        return LockMode.SKIP_LOCKED if version >= (10, 6) else LockMode.BLOCKING
    return LockMode.SKIP_LOCKED if version >= (8, 0, 1) else LockMode.BLOCKING


def locking(stmt: Select[Any], mode: LockMode) -> Select[Any]:
    """``stmt`` with the row-locking clause of ``mode`` (MySQL's compiler drops ``OF message_inbox``)."""
    if mode is LockMode.SKIP_LOCKED:
        return stmt.with_for_update(skip_locked=True, of=inbox)
    if mode is LockMode.BLOCKING:
        return stmt.with_for_update(of=inbox)
    return stmt


def claim(conn: Connection, stmt: Select[Any], *, until: dt.datetime | None) -> list[Candidate]:
    """Lock and return the rows of ``stmt``; with ``until`` also move their ``resend_at`` there.

    Runs inside the caller's transaction: the rows are claimed when the caller commits. ``until=None`` takes
    the row locks only (what the claim tests look at: the locks alone, held while their transaction is
    open). ``stmt`` in its
    dialect's shape (``due_statement(…, dialect=…)``) brings the stubs along where the lock clause locks
    inbox rows only (PostgreSQL's ``FOR UPDATE OF``, SQLite's database lock).
    """
    result = conn.execute(locking(stmt, lock_mode(conn)))
    candidates = Candidate.from_rows(list(result.keys()), result.all())
    if candidates and until is not None:
        keys = [(c.consumer_group, c.message_id) for c in candidates]
        # updated_at dates the group's last send (verdict.py): the claim is not one (the column's onupdate
        # stamped the claim's wall-clock time on it, and a queued copy was never found too old). Through the
        # primary key: read through the (message_id, status) index, the UPDATE reached every group's row of
        # its ids, locking each before it checked the group — another group's row a guard held among them —
        # and deadlocked with that guard (a busy two-group topic: a round in a few hundred, 2026-11-29)
        moved = (
            update(inbox).where(pair_in(conn, keys)).values(resend_at=until, updated_at=inbox.c.updated_at)
        )
        conn.execute(by_primary_key(moved, inbox))
    return candidates


def still_claimed(
    conn: Connection, rows: Sequence[Candidate], claimed_until: dt.datetime
) -> set[tuple[str, str]]:
    """Lock ``rows`` in the guard's order (each group's rows in message id order: a record locking them in
    another order could deadlock with a guard's batch) and return the ``(group, message_id)`` of those
    still ``PENDING`` and still carrying the claim (``resend_at = claimed_until``): the rows the record may
    write its verdicts on. The others were confirmed, voided or given up meanwhile, or claimed again by
    another sweeper once this claim ended. On SQLite the transaction's write lock does the locking.

    PostgreSQL locks them in the ``ORDER BY``'s order (message id, then group). InnoDB locks in the order of
    the index it reads, whatever the ``ORDER BY``: MariaDB/MySQL read them through the primary key
    (:func:`reliable.outbox.keys.by_primary_key`), which locks the rows alone, one group's after another's,
    each group's in message id order (a guard locks one group's rows). Left to itself InnoDB read the key list
    through the ``(message_id, status)`` index (always for a batch of one message in two groups, ``message_id
    = m AND consumer_group IN (…)``), locking each row's entry in that index, then the row. A guard confirming
    a row locks the row (``SELECT … FOR UPDATE``) and then, its ``UPDATE`` of ``status`` moving the row in
    that index, the entry: the record held the entry and waited for the row, the guard the reverse — a
    deadlock that failed the sweep round before it told anyone of DEAD rows or stalls (2026-11-29;
    tests/sweeper/test_record_lock_order.py). The settle walk's share locks on that index's entries (gone
    since: :func:`reliable.outbox.settle_slice` runs at READ COMMITTED) made a third party of it.
    """
    if not rows:
        return set()
    keys = sorted({(c.consumer_group, c.message_id) for c in rows})
    ours = case((and_(inbox.c.status == StubStatus.PENDING, inbox.c.resend_at == claimed_until), 1), else_=0)
    stmt = (
        select(inbox.c.consumer_group, inbox.c.message_id, ours.label("ours"))
        .where(pair_in(conn, keys))
        .order_by(inbox.c.message_id, inbox.c.consumer_group)
    )
    if conn.dialect.name != "sqlite":
        stmt = by_primary_key(stmt.with_for_update(), inbox)
    return {(r.consumer_group, r.message_id) for r in conn.execute(stmt) if r.ours}


def pair_in(conn: Connection, keys: Sequence[tuple[str, str]]) -> ColumnElement[bool]:
    """``message_inbox``'s ``(consumer_group, message_id) IN (…)`` (:mod:`reliable.outbox.keys`)."""
    return columns_in(conn, inbox.c.consumer_group, inbox.c.message_id, keys)
