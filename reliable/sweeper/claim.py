"""Claiming due inbox rows so that several sweepers never send the same (group, message) in one round.

Every claim starts with the selection statement plus a row-locking clause::

    SELECT <due_statement> FOR UPDATE [OF message_inbox] SKIP LOCKED

Rows another sweeper has locked are skipped, not waited on. Two strategies use it
(``Sweeper(claim_ttl_s=…)``):

* **row locks** (default, ``claim_ttl_s=None``): one transaction per batch — select-and-lock, send, write
  the outcomes (one statement per batch), commit. The locks are the claim. One row write per stub: the
  fastest (bench c1). While a batch is being sent, a consumer confirming one of its stubs waits for the
  commit (at most one batch of broker calls: keep batches small with a slow broker), and a sweeper that
  dies mid-batch rolls back: those stubs are due again at once (re-sent twice: at-least-once; the guard
  deduplicates).
* **leases** (``claim_ttl_s=N``): a short transaction selects-and-locks and moves the rows' ``resend_at``
  N seconds ahead, then commits; the sends run with no transaction open and the outcomes are written in a
  second transaction. No lock is held during broker calls; costs a second row write per stub; a sweeper
  that dies leaves its rows for N seconds.

After either commit the rows are no longer due (their ``resend_at`` is in the future), so another sweeper's
next selection does not see them.

Per backend:

* PostgreSQL, MariaDB 10.6+, MySQL 8.0.1+: ``FOR UPDATE SKIP LOCKED`` (:attr:`LockMode.SKIP_LOCKED`).
* older MariaDB/MySQL: plain ``FOR UPDATE`` (:attr:`LockMode.BLOCKING`): still correct — the second
  sweeper waits for the first to commit and then no longer sees its rows — only slower.
* SQLite (:attr:`LockMode.SERIAL`) has no row locks. :func:`reliable.facade.make_engine` opens every
  transaction with ``BEGIN IMMEDIATE``, which takes the database write lock before the SELECT, so claim
  transactions are serialised and select-then-update is atomic. Two sweepers on one SQLite file therefore
  do not double-send, but they queue behind each other and — with row-lock claims, for a whole batch of
  sends — behind every consumer write: run one sweeper per SQLite database, with small batches or
  lease claims (docs/sweeper.md).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, Select, and_, or_, tuple_, update

from reliable.sweeper.selection import Candidate, inbox


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

    Runs inside the caller's transaction: the rows are claimed when the caller commits. ``until=None`` keeps
    the row locks only (the sweeper then finishes its work inside the same transaction). ``stmt`` in its
    dialect's shape (``due_statement(…, dialect=…)``) brings the stubs along where the lock clause locks
    inbox rows only (PostgreSQL's ``FOR UPDATE OF``, SQLite's database lock).
    """
    result = conn.execute(locking(stmt, lock_mode(conn)))
    candidates = Candidate.from_rows(list(result.keys()), result.all())
    if candidates and until is not None:
        keys = [(c.consumer_group, c.message_id) for c in candidates]
        conn.execute(update(inbox).where(pair_in(conn, keys)).values(resend_at=until))
    return candidates


def pair_in(conn: Connection, keys: Sequence[tuple[str, str]]) -> ColumnElement[bool]:
    """``(consumer_group, message_id) IN (…)``; an OR of pairs on SQLite, where row values do not work
    through every driver."""
    if conn.dialect.name == "sqlite":
        return or_(*[and_(inbox.c.consumer_group == g, inbox.c.message_id == m) for g, m in keys])
    return tuple_(inbox.c.consumer_group, inbox.c.message_id).in_(list(keys))
