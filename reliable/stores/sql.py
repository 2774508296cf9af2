"""SQL primitives of the consumer guard for SQLite, PostgreSQL and MariaDB/MySQL, per ``(group, message_id)``.

Why hand-written SQL: the guard runs once per delivery, and an ORM unit of work (or even a Core statement
compiled per call) costs more than a local database round trip. Every statement is rendered once per dialect
(:mod:`reliable.stores.sql_text`) and run on the DBAPI cursor of the caller's SQLAlchemy ``Connection``
(:class:`reliable.stores.sql_runner.DbapiRunner`), inside its transaction, so the handler's ``Session`` (bound
to the same ``Connection``) shares it.

Round trips per primitive (PostgreSQL / SQLite / MariaDB); the journal's own statements are in
:mod:`reliable.stores.sql_journal`:

* transaction: on psycopg ``BEGIN`` rides on the first statement and ``COMMIT`` on the last
  (:meth:`SqlStore.transaction`); elsewhere as the driver does it (SQLite ``BEGIN IMMEDIATE``).
* single-message opener (:meth:`SqlStore.journal_first`): the happy case — confirm the group's PENDING row and
  settle the stub, or claim a fresh inbox row — plus the journal row, one statement on PostgreSQL (with
  ``BEGIN``), two or three elsewhere.
* inbox lock: one ``SELECT … FOR UPDATE`` of the group's rows (SQLite: plain ``SELECT``; the engine opened the
  transaction with ``BEGIN IMMEDIATE``, which already holds the database write lock).
* inbox claim: one ``INSERT … ON CONFLICT DO NOTHING RETURNING`` (MariaDB: ``INSERT IGNORE … RETURNING``). A
  concurrent uncommitted insert of the same ``(group, id)`` makes it wait; when that one commits we get no row
  back — the primary key is the lock (inbox pattern).
* confirm: one conditional ``UPDATE`` of the group's rows, plus the stub settle (``CONFIRMED`` once no other
  group owes the message) and the journal outcomes — one statement on PostgreSQL, three elsewhere; the caller
  checks the row count. Only when fewer stubs settled than rows confirmed (another group still open, or
  confirming at this instant) does :meth:`SqlStore.settle_exact` add two statements.
* handler failure: one upsert of the group's ``attempts`` (MariaDB: plus a read-back).

All timestamps are bound as UTC: aware on PostgreSQL (``timestamptz``), naive UTC on MariaDB, and on SQLite as
text in exactly the format SQLAlchemy's ``DateTime`` writes, so string comparisons in other queries agree.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine

from reliable.stores import InboxRow, InboxState, JournalEntry, OutcomeUpdate
from reliable.stores import sql_text as T
from reliable.stores.sql_journal import JournalSql
from reliable.stores.sql_runner import DbapiRunner
from reliable.types import LogOutcome, StubStatus


@dataclass(frozen=True, slots=True)
class FirstStep:
    """The single-message happy case :meth:`SqlStore.journal_first` tries (see there)."""

    group: str
    row: InboxRow
    claim: bool  # True: insert the inbox row (inbox pattern); False: confirm the producer's PENDING row
    now: dt.datetime
    outcome: LogOutcome
    reason: str


class SqlStore:
    """The database primitives the guard composes (see the module docstring for the round-trip budget)."""

    def __init__(self, engine: Engine, *, durable_journal: bool = False) -> None:
        self.engine = engine
        #: PostgreSQL only: whether the journal statement waits for its WAL flush (see :meth:`journal`).
        self.db = DbapiRunner(engine)
        #: the journal's statements (log rows, watermarks, outcomes): built in one place
        self.log = JournalSql(self.db, durable_journal=durable_journal)
        self.dialect = engine.dialect.name
        self._pg = self.dialect == "postgresql"
        self._my = self.dialect in ("mysql", "mariadb")
        self._lock = "" if self.dialect == "sqlite" else " FOR UPDATE"
        self._pk = T.PK_ORDER if self._my else ""
        #: MariaDB: a batch's confirm settles its stubs with the exact step straight away. The optimistic
        #: settle ``UPDATE`` locked the stubs it settled, then the exact step locked the open ones from the
        #: lowest id up: two groups confirming one batch each held a stub the other's second pass wanted
        self.settles_exactly = self._my
        self._ts = self.db.ts

    # --- execution (delegated to the runner; ``execute`` is used by the guard) ----------------------------
    def execute(self, conn: Connection, sql: str) -> None:
        """A parameterless statement (e.g. ``SET TRANSACTION …``) through the same lean path."""
        self.db.execute(conn, sql)

    def no_gap_locks(self, conn: Connection) -> None:
        """MariaDB: the next transaction at READ COMMITTED. At REPEATABLE READ a ``FOR UPDATE`` on an absent
        row takes a gap lock (two racing inserts of one key deadlock) and a plain read sees the snapshot of
        the transaction's first read, older than a row another worker has committed since."""
        if self._my:
            self.db.execute(conn, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED")

    @contextlib.contextmanager
    def transaction(self, conn: Connection, *, pipelined_begin: bool = False) -> Iterator[None]:
        """One guard transaction on ``conn``: commits on normal exit, rolls back on an exception.

        On psycopg the transaction is driven by the statements themselves: the first one the guard sends
        carries ``BEGIN`` (``begin=True``), the last ``COMMIT`` (``commit=True``), so neither costs a round
        trip of its own. SQLAlchemy still sees an open transaction (the handler's ``Session`` joins it,
        savepoints work), and its commit at the end finds the server idle and sends nothing; a rollback is
        sent only if the server is still in the block. The driver runs in autocommit mode meanwhile, so that
        a first statement sent through psycopg itself does not get a ``BEGIN`` of psycopg's own — unless
        ``pipelined_begin`` says the first statement is sent with ``BEGIN`` through libpq's pipeline
        (:meth:`DbapiRunner.all`, synchronous psycopg): psycopg then only ever sees the session inside that
        transaction (or idle after its ``COMMIT``), so its autocommit setting is never consulted and is left
        alone.
        """
        if not self.db.piggybacks or (pipelined_begin and self.db.pipelines(conn)):
            with conn.begin():
                yield
            return
        self.db.autocommit(conn, True)
        try:
            with conn.begin():
                yield
        finally:
            if not conn.invalidated:
                self.db.autocommit(conn, False)

    def journal_first(
        self, conn: Connection, entry: JournalEntry, first: FirstStep
    ) -> tuple[int, bool, bool]:
        """Open the work transaction of one message: the happy case and its journal row, before the handler.

        ``first.claim`` False: confirm the group's ``PENDING``/``DEAD`` inbox row whose recorded hash (if any)
        matches, and settle the stub; True: insert the group's ``CONFIRMED`` row unless one exists (inbox
        pattern, no producer row). The journal row records ``first.outcome`` only if that changed a row (a
        handler failure rolls all of it back). PostgreSQL: one statement, carrying ``BEGIN``; elsewhere two
        or three. Returns (log id, changed, stub settled); not changed means "not the happy case": nothing
        but the journal row was written and the caller takes the general path to find out why.
        """
        ts = self._ts(first.now)
        if first.claim:
            head: tuple[Any, ...] = self._inbox_params(first.group, first.row, StubStatus.CONFIRMED, 0, ts)
        else:
            h = first.row.payload_hash
            head = (ts, ts, first.group, first.row.message_id, h, h)
        log = list(self.log.row(entry))
        if self._pg:
            settle = not first.claim
            sql = self.db.cached("first_pg", int(first.claim), lambda k: T.pg_first(bool(k)))
            stub = (ts, ts, first.row.message_id, first.group) if settle else ()
            log[T.LOG_OUTCOME], log[T.LOG_REASON] = first.outcome.value, first.reason
            row = self.db.all(conn, sql, (*head, *stub, *log), begin=True)[0]
            return int(row[0]), int(row[1]) == 1, int(row[2]) == 1
        if first.claim:
            sql = self.db.cached("claim", 1, lambda k: T.claim_inbox(k, self._my))
            changed = bool(self.db.all(conn, sql, head))
            settled = True  # a claimed row has no producer stub to settle
        else:
            changed = (
                self.db.run(
                    conn,
                    self.db.cached("confirm_first", 1, lambda _: T.confirm_first(self._pg, self._pk)),
                    head,
                )
                == 1
            )
            settled = changed and self._settle(conn, first.group, [first.row.message_id], ts) == 1
        if changed:
            log[T.LOG_OUTCOME], log[T.LOG_REASON] = first.outcome.value, first.reason
        log_id = int(self.db.all(conn, self.db.cached("journal_log", 1, T.log_insert), tuple(log))[0][0])
        return log_id, changed, settled

    # --- step 2 helper: what does the database say about a message held by another worker? -------------
    def peek_inbox(self, conn: Connection, group: str, message_ids: Iterable[str]) -> dict[str, InboxState]:
        """Read the group's inbox rows without locking (lease-conflict check)."""
        return self._select_inbox(conn, group, sorted(set(message_ids)), "")

    # --- step 3: the work transaction ------------------------------------------------------------------
    def lock_inbox(self, conn: Connection, group: str, message_ids: Sequence[str]) -> dict[str, InboxState]:
        """``SELECT … FOR UPDATE`` the group's rows in id order: concurrent deliveries queue up behind us."""
        return self._select_inbox(conn, group, sorted(set(message_ids)), self._lock)

    def read_claim_losers(
        self, conn: Connection, group: str, message_ids: Sequence[str]
    ) -> dict[str, InboxState]:
        """The rows :meth:`claim_inbox` found already there, as committed, still locked until the commit.

        MariaDB's ``INSERT IGNORE`` left a shared lock on each: read them in share mode. ``FOR UPDATE`` asked
        to upgrade it — two deliveries of one message that both lost the claim then waited on each other's
        shared lock, a deadlock answered as an outage. Elsewhere: :meth:`lock_inbox`.
        """
        if not self._my:
            return self.lock_inbox(conn, group, message_ids)
        return self._select_inbox(conn, group, sorted(set(message_ids)), " LOCK IN SHARE MODE")

    def _select_inbox(
        self, conn: Connection, group: str, ids: Sequence[str], suffix: str
    ) -> dict[str, InboxState]:
        """The group's rows of ``ids``; ``suffix``: the locking clause ("" for none)."""
        if not ids:
            return {}
        sql = self.db.cached("inbox" + suffix, len(ids), lambda k: T.select_inbox(k, suffix, self._pk))
        rows = self.db.all(conn, sql, (group, *ids))
        return {r[0]: InboxState(StubStatus(r[1]), r[2], int(r[3])) for r in rows}

    def _inbox_params(
        self, group: str, row: InboxRow, status: StubStatus, attempts: int, ts: Any
    ) -> tuple[Any, ...]:
        """One row's values in ``INBOX_COLS`` order."""
        confirmed = ts if status is StubStatus.CONFIRMED else None
        return (group, row.message_id, status.value, attempts, row.payload_hash, ts, confirmed, 0, ts, ts)

    def claim_inbox(
        self, conn: Connection, group: str, rows: Sequence[InboxRow], now: dt.datetime
    ) -> set[str]:
        """Insert ``CONFIRMED`` inbox rows for ids the group has none of; return the ids this call inserted.

        An id missing from the result already had a row (possibly inserted and committed by a concurrent
        worker while we waited on its key lock): the caller locks and re-reads it.
        """
        if not rows:
            return set()
        rows = sorted(rows, key=lambda r: r.message_id)
        ts = self._ts(now)
        params: list[Any] = []
        for r in rows:
            params += self._inbox_params(group, r, StubStatus.CONFIRMED, 0, ts)
        sql = self.db.cached("claim", len(rows), lambda k: T.claim_inbox(k, self._my))
        return {r[0] for r in self.db.all(conn, sql, tuple(params))}

    def confirm(
        self, conn: Connection, group: str, message_ids: Sequence[str], now: dt.datetime
    ) -> tuple[int, int]:
        """Conditional confirm of the group's PENDING/DEAD rows, then settle their stubs.

        Returns (inbox rows confirmed, stubs that became CONFIRMED); the caller demands all of the first. A
        stub becomes ``CONFIRMED`` here when no other group still owes it — see :meth:`settle_exact` for when
        fewer stubs than rows settled.
        """
        if not message_ids:
            return 0, 0
        ts = self._ts(now)
        ids = sorted(message_ids)  # id order, as every other step locks rows
        changed = self.db.run(
            conn,
            self.db.cached("confirm", len(ids), lambda k: T.confirm_inbox(k, self._pk)),
            (ts, ts, group, *ids),
        )
        if self.settles_exactly:
            return changed, self.settle_exact(conn, group, ids, now)
        return changed, self._settle(conn, group, ids, ts)

    def settle_exact(self, conn: Connection, group: str, message_ids: Sequence[str], now: dt.datetime) -> int:
        """Settle again under the stubs' row locks: the exact step after a confirm that settled fewer stubs.

        Two groups confirming one message at once each see the other's row as still open. Locking the open
        stubs first serialises them: whoever locks second waits for the first to commit and its next statement
        sees that confirm. Costs two statements, only for a group that was not (or not yet seen as) the last;
        a message without a stub costs the lock statement alone.
        """
        ids = sorted(set(message_ids))
        open_ = self.db.all(
            conn,
            self.db.cached("open_stubs", len(ids), lambda k: T.lock_open_stubs(k, self._lock, self._pk)),
            tuple(ids),
        )
        if not open_:
            return 0
        return self._settle(conn, group, [r[0] for r in open_], self._ts(now))

    def confirm_first(
        self,
        conn: Connection,
        message_id: str,
        group: str,
        payload_hash: str | None,
        now: dt.datetime,
        record: OutcomeUpdate,
    ) -> tuple[bool, bool]:
        """Confirm one group's row *before* its handler runs, if PENDING/DEAD with a matching body.

        The conditional ``UPDATE`` locks the row like ``SELECT … FOR UPDATE`` would; on success the stub is
        settled and ``record`` written (a handler failure rolls all of it back). Returns (confirmed, stub
        settled). The guard itself uses :meth:`journal_first`, which adds the journal row to this.
        """
        ts = self._ts(now)
        params = (ts, ts, group, message_id, payload_hash, payload_hash)
        if (
            self.db.run(
                conn,
                self.db.cached("confirm_first", 1, lambda _: T.confirm_first(self._pg, self._pk)),
                params,
            )
            != 1
        ):
            return False, False
        settled = self._settle(conn, group, [message_id], ts)
        self.log.set_outcomes(conn, [record])
        return True, settled == 1

    def _settle(self, conn: Connection, group: str, message_ids: Sequence[str], ts: Any) -> int:
        n = len(message_ids)
        sql = self.db.cached("settle", n, lambda k: T.settle_stubs(k, self._pk))
        return self.db.run(conn, sql, (ts, ts, *message_ids, group))

    def confirm_and_record(
        self,
        conn: Connection,
        group: str,
        message_ids: Sequence[str],
        now: dt.datetime,
        updates: Sequence[OutcomeUpdate],
    ) -> tuple[int, int]:
        """:meth:`confirm` plus :meth:`set_outcomes` — one statement on PostgreSQL (data-modifying CTEs).

        Returns (inbox rows confirmed, stubs settled); the caller rolls back unless the first is all of them.
        """
        if not self._pg or not updates:
            counts = self.confirm(conn, group, message_ids, now)
            self.log.set_outcomes(conn, updates)
            return counts
        n, m = len(message_ids), len(updates)
        sql = self.db.cached("confirm_record_pg", n, lambda k: T.pg_confirm_record(k, m), m)
        ts = self._ts(now)
        params: list[Any] = [ts, ts, group, *message_ids, ts, ts, *message_ids, group] if n else []
        for u in updates:
            params += (u.log_id, u.outcome.value, u.reason)
        rows = self.db.all(conn, sql, tuple(params))
        return int(rows[0][0]), int(rows[0][1])

    def unclaim_inbox(self, conn: Connection, group: str, message_ids: Sequence[str]) -> None:
        """Delete inbox rows this transaction inserted for messages whose handler then failed (batch mode)."""
        if not message_ids:
            return
        sql = self.db.cached("unclaim", len(message_ids), lambda k: T.unclaim_inbox(k, self._my))
        self.db.run(conn, sql, (group, *message_ids))

    # --- step 5: a handler failure ------------------------------------------------------------------------
    def record_failure(
        self,
        conn: Connection,
        group: str,
        row: InboxRow,
        now: dt.datetime,
        error: str,
        *,
        begin: bool = False,
    ) -> int | None:
        """Count one handler failure on the group's inbox row (created PENDING if absent); returns attempts,
        or ``None`` when the row is CONFIRMED (another worker applied it meanwhile: nothing counted).

        Only handler failures come here: lease conflicts and database outages never touch ``attempts``.
        """
        ts = self._ts(now)
        params = (*self._inbox_params(group, row, StubStatus.PENDING, 1, ts), error[:2000])
        rows = (
            self.db.all(
                conn, self.db.cached("failure", 1, lambda _: T.upsert_failure(False)), params, begin=begin
            )
            if not self._my
            else None
        )
        if rows is not None:
            return int(rows[0][0]) if rows else None
        self.db.run(conn, self.db.cached("failure", 1, lambda _: T.upsert_failure(True)), params)
        # a locking read: it sees the row as committed now (the upsert just locked it), where a plain read at
        # REPEATABLE READ saw the snapshot of the transaction's first read — a row another worker inserted
        # after that was missing (a KeyError out of the guard) or still PENDING though it was confirmed
        state = self._select_inbox(conn, group, [row.message_id], self._lock).get(row.message_id)
        if state is None:  # deleted since the upsert (cannot be, under its lock): count it, safely retried
            return 1
        return None if state.status is StubStatus.CONFIRMED else state.attempts


def reason_text(kind: str, detail: str | None, limit: int = 1000) -> str:
    """``kind: detail`` for ``message_log.reason``, bounded so a huge exception text cannot bloat the row."""
    if not detail:
        return kind
    text = f"{kind}: {detail}"
    return text if len(text) <= limit else text[: limit - 1] + "…"
