"""SQL primitives of the consumer guard for SQLite, PostgreSQL and MariaDB/MySQL, per ``(group, message_id)``.

Why hand-written SQL: the guard runs once per delivery, and an ORM unit of work (or even a Core statement
compiled per call) costs more than a local database round trip. Every statement is rendered once per dialect
(:mod:`reliable.stores.sql_text`) and run on the DBAPI cursor of the caller's SQLAlchemy ``Connection``
(:class:`reliable.stores.sql_runner.DbapiRunner`), inside its transaction, so the handler's ``Session`` (bound
to the same ``Connection``) shares it.

Round trips per primitive (PostgreSQL / SQLite / MariaDB):

* journal: one statement on PostgreSQL (a data-modifying CTE inserts the log rows *and* upserts the
  watermark of each *delivered* queue), two elsewhere; a batch of N deliveries is still one or two statements.
* inbox lock: one ``SELECT … FOR UPDATE`` of the group's rows (SQLite: plain ``SELECT``; the engine opened the
  transaction with ``BEGIN IMMEDIATE``, which already holds the database write lock).
* inbox claim: one ``INSERT … ON CONFLICT DO NOTHING RETURNING`` (MariaDB: ``INSERT IGNORE … RETURNING``). A
  concurrent uncommitted insert of the same ``(group, id)`` makes it wait; when that one commits we get no row
  back — the primary key is the lock (inbox pattern). A single message on PostgreSQL also writes its journal
  outcome in the same statement (:meth:`SqlStore.claim_first`), like the confirm below.
* confirm: one conditional ``UPDATE`` of the group's rows, plus the stub settle (``CONFIRMED`` once no other
  group owes the message) and the journal outcomes — one statement on PostgreSQL, three elsewhere; the caller
  checks the row count. Only when fewer stubs settled than rows confirmed (another group still open, or
  confirming at this instant) does :meth:`SqlStore.settle_exact` add two statements.
* handler failure: one upsert of the group's ``attempts`` (MariaDB: plus a read-back).

All timestamps are bound as UTC: aware on PostgreSQL (``timestamptz``), naive UTC on MariaDB, and on SQLite as
text in exactly the format SQLAlchemy's ``DateTime`` writes, so string comparisons in other queries agree.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Engine

from reliable.stores import InboxRow, InboxState, JournalEntry, OutcomeUpdate
from reliable.stores import sql_text as T
from reliable.stores.sql_runner import DbapiRunner
from reliable.stores.sql_text import (
    LOG_COLS,
    LOG_WIDTH,
    OUTCOME_SQL,
    my_progress,
    pg_journal,
    pg_progress,
    progress_rows,
    rows_sql,
    sqlite_progress,
)
from reliable.types import StubStatus


class SqlStore:
    """The database primitives the guard composes (see the module docstring for the round-trip budget)."""

    def __init__(self, engine: Engine, *, durable_journal: bool = False) -> None:
        self.engine = engine
        #: PostgreSQL only: whether the journal statement waits for its WAL flush (see :meth:`journal`).
        self.durable_journal = durable_journal
        self.db = DbapiRunner(engine)
        self.dialect = engine.dialect.name
        self._pg = self.dialect == "postgresql"
        self._my = self.dialect in ("mysql", "mariadb")
        self._lock = "" if self.dialect == "sqlite" else " FOR UPDATE"
        self._ts = self.db.ts

    # --- execution (delegated to the runner; ``execute``/``autocommit`` are used by the guard) -----------
    def execute(self, conn: Connection, sql: str) -> None:
        """A parameterless statement (e.g. ``SET TRANSACTION …``) through the same lean path."""
        self.db.execute(conn, sql)

    def autocommit(self, conn: Connection, on: bool) -> None:
        """Switch the DBAPI connection's autocommit (PostgreSQL journal); only outside a transaction."""
        self.db.autocommit(conn, on)

    # --- step 1: journal ------------------------------------------------------------------------------
    @property
    def journal_autocommits(self) -> bool:
        """PostgreSQL journals in one autocommitted statement: no BEGIN/COMMIT round trips."""
        return self._pg

    def journal(self, conn: Connection, entries: Sequence[JournalEntry]) -> list[int]:
        """Insert one ``message_log`` row per entry and raise the ``consume_progress`` watermarks.

        Returns the new log ids in the order of ``entries``. Runs inside the caller's transaction; the caller
        commits at once so the delivery is visible even if processing fails later.

        On PostgreSQL the statement switches ``synchronous_commit`` off for its own transaction unless
        ``durable_journal``: the commit is visible at once but does not wait for the WAL flush. That is safe
        because nothing that guarantees exactly-once reads the journal: if the server crashes within the
        WAL writer delay (200 ms by default), the lost rows only make the sweeper re-send a stub that the
        guard then recognises (CONFIRMED) or processes (still PENDING: it really was not done). The work
        transaction that follows commits synchronously and flushes the journal's WAL with it.
        """
        if not entries:
            return []
        log_params: list[Any] = []
        for e in entries:
            log_params += self._log_row(e)
        progress = progress_rows(entries, self._ts(entries[0].received_at))
        prog_params = [v for row in progress for v in row]
        n, m = len(entries), len(progress)
        if self._pg:
            name = "journal_pg_sync" if self.durable_journal else "journal_pg"
            sql = self.db.cached(name, n, lambda k: pg_journal(k, m, self.durable_journal), m)
            rows = self.db.all(conn, sql, tuple(log_params + prog_params))
        else:
            sql = self.db.cached(
                "journal_log",
                n,
                lambda k: (
                    f"INSERT INTO message_log ({LOG_COLS}) VALUES {rows_sql(k, LOG_WIDTH)} RETURNING id"
                ),
            )
            rows = self.db.all(conn, sql, tuple(log_params))
            build = my_progress if self._my else sqlite_progress
            self.db.run(conn, self.db.cached("progress", m, build), tuple(prog_params))
        # ids come from one sequence/auto-increment in VALUES order, so sorting restores entry order even
        # where RETURNING does not promise it.
        return sorted(int(r[0]) for r in rows)

    def _log_row(self, e: JournalEntry) -> tuple[Any, ...]:
        """One ``message_log`` row's values, in ``LOG_COLS`` order (shared by both journal paths)."""
        return (
            e.message_id,
            e.consumer_group,
            e.topic,
            e.queue_id,
            e.queue_offset,
            e.reconsume_times,
            self._ts(e.received_at),
            None if e.outcome is None else e.outcome.value,
            e.worker,
            e.reason,
            e.original_topic,
            e.broker_name,
        )

    def journal_bulk(self, conn: Connection, entries: Sequence[JournalEntry]) -> None:
        """:meth:`journal` without returning ids, for the write-behind journal's large flushes.

        One single-row ``INSERT`` run with ``executemany`` (psycopg pipelines it into one round trip and
        prepares it once, where a fresh 200-row ``VALUES`` list would be parsed and planned every time) plus
        one watermark upsert per queue.
        """
        if not entries:
            return
        rows = [self._log_row(e) for e in entries]
        if self._pg and not self.durable_journal:  # as in :meth:`journal`: no wait for the WAL flush
            self.db.run(conn, "SELECT set_config('synchronous_commit', 'off', true)", ())
        sql = self.db.cached(
            "journal_bulk",
            1,
            lambda _: f"INSERT INTO message_log ({LOG_COLS}) VALUES {rows_sql(1, LOG_WIDTH)}",
        )
        self.db.run(conn, sql, rows, many=True)
        build = pg_progress if self._pg else my_progress if self._my else sqlite_progress
        progress = progress_rows(entries, self._ts(entries[0].received_at))
        self.db.run(conn, self.db.cached("progress_bulk", 1, build), progress, many=True)

    # --- step 2 helper: what does the database say about a message held by another worker? -------------
    def peek_inbox(self, conn: Connection, group: str, message_ids: Iterable[str]) -> dict[str, InboxState]:
        """Read the group's inbox rows without locking (lease-conflict check)."""
        return self._select_inbox(conn, group, sorted(set(message_ids)), lock=False)

    # --- step 3: the work transaction ------------------------------------------------------------------
    def lock_inbox(self, conn: Connection, group: str, message_ids: Sequence[str]) -> dict[str, InboxState]:
        """``SELECT … FOR UPDATE`` the group's rows in id order: concurrent deliveries queue up behind us."""
        return self._select_inbox(conn, group, sorted(set(message_ids)), lock=True)

    def _select_inbox(
        self, conn: Connection, group: str, ids: Sequence[str], *, lock: bool
    ) -> dict[str, InboxState]:
        if not ids:
            return {}
        suffix = self._lock if lock else ""
        sql = self.db.cached("inbox" + suffix, len(ids), lambda k: T.select_inbox(k, suffix))
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
        n = len(message_ids)
        changed = self.db.run(
            conn, self.db.cached("confirm", n, T.confirm_inbox), (ts, ts, group, *message_ids)
        )
        settled = self.db.run(
            conn, self.db.cached("settle", n, T.settle_stubs), (ts, ts, *message_ids, group)
        )
        return changed, settled

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
            self.db.cached("open_stubs" + self._lock, len(ids), lambda k: T.lock_open_stubs(k, self._lock)),
            tuple(ids),
        )
        if not open_:
            return 0
        ts = self._ts(now)
        locked = [r[0] for r in open_]
        return self.db.run(
            conn, self.db.cached("settle", len(locked), T.settle_stubs), (ts, ts, *locked, group)
        )

    def confirm_first(
        self,
        conn: Connection,
        message_id: str,
        group: str,
        payload_hash: str | None,
        now: dt.datetime,
        record: OutcomeUpdate,
    ) -> tuple[bool, bool]:
        """Single-message fast path: confirm the group's inbox row *before* the handler runs.

        The conditional ``UPDATE`` locks the row like ``SELECT … FOR UPDATE`` would and succeeds only for a
        ``PENDING``/``DEAD`` row whose recorded hash (if any) matches; on PostgreSQL the same statement also
        settles the stub and writes the journal outcome (elsewhere two more statements). If the handler then
        fails, the rollback undoes all of it. Returns (confirmed, stub settled). Not confirmed means "not the
        happy case" (no row, already confirmed, voided, other body): nothing was changed and the caller takes
        the general path to find out which.
        """
        ts = self._ts(now)
        params: tuple[Any, ...] = (ts, ts, group, message_id, payload_hash, payload_hash)
        if self._pg:
            sql = self.db.cached(
                "confirm_first_pg", 1, lambda _: T.pg_with_outcome(T.confirm_first(True), True)
            )
            rows = self.db.all(
                conn,
                sql,
                (*params, ts, ts, message_id, group, record.outcome.value, record.reason, record.log_id),
            )
            return int(rows[0][0]) == 1, int(rows[0][1]) == 1
        if (
            self.db.run(conn, self.db.cached("confirm_first", 1, lambda _: T.confirm_first(False)), params)
            != 1
        ):
            return False, False
        settled = self.db.run(conn, self.db.cached("settle", 1, T.settle_stubs), (ts, ts, message_id, group))
        self.set_outcomes(conn, [record])
        return True, settled == 1

    @property
    def claims_with_outcome(self) -> bool:
        """Whether :meth:`claim_first` writes the journal outcome in the claiming statement (PostgreSQL)."""
        return self._pg

    def claim_first(
        self, conn: Connection, group: str, row: InboxRow, now: dt.datetime, record: OutcomeUpdate
    ) -> bool:
        """Single-message inbox fast path (PostgreSQL): claim the inbox row and write the outcome at once.

        The counterpart of :meth:`confirm_first` for producers without stubs: one data-modifying CTE inserts
        the ``CONFIRMED`` row (``ON CONFLICT DO NOTHING``) and, only if it did, records ``record`` on the
        journal row — before the handler runs, so the commit after it is the only round trip left; a handler
        failure rolls both back. False: the group already had a row (nothing changed); the caller locks it.
        """
        ts = self._ts(now)
        sql = self.db.cached(
            "claim_first_pg", 1, lambda _: T.pg_with_outcome(T.claim_inbox(1, False, ""), False)
        )
        params = (
            *self._inbox_params(group, row, StubStatus.CONFIRMED, 0, ts),
            record.outcome.value,
            record.reason,
            record.log_id,
        )
        return int(self.db.all(conn, sql, params)[0][0]) == 1

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
            self.set_outcomes(conn, updates)
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
        sql = self.db.cached(
            "unclaim",
            len(message_ids),
            lambda k: (
                f"DELETE FROM message_inbox WHERE consumer_group = ? AND message_id IN ({T.marks(k)}) "
                "AND status = 'CONFIRMED'"
            ),
        )
        self.db.run(conn, sql, (group, *message_ids))

    # --- step 5: a handler failure ------------------------------------------------------------------------
    def record_failure(
        self, conn: Connection, group: str, row: InboxRow, now: dt.datetime, error: str
    ) -> int:
        """Count one handler failure on the group's inbox row (created PENDING if absent); returns attempts.

        Only handler failures come here: lease conflicts and database outages never touch ``attempts``.
        """
        ts = self._ts(now)
        params = (*self._inbox_params(group, row, StubStatus.PENDING, 1, ts), error[:2000])
        rows = (
            self.db.all(conn, self.db.cached("failure", 1, lambda _: T.upsert_failure(self._my)), params)
            if not self._my
            else None
        )
        if rows is not None:
            return int(rows[0][0])
        self.db.run(conn, self.db.cached("failure", 1, lambda _: T.upsert_failure(True)), params)
        state = self._select_inbox(conn, group, [row.message_id], lock=False)[row.message_id]
        return state.attempts

    # --- outcomes ---------------------------------------------------------------------------------------
    def set_outcomes(self, conn: Connection, updates: Sequence[OutcomeUpdate]) -> None:
        """Fill ``message_log.outcome``/``reason`` (one statement; executemany pipelines on psycopg)."""
        if not updates:
            return
        sql = self.db.cached("outcome", 1, lambda _: OUTCOME_SQL)
        params = [(u.outcome.value, u.reason, u.log_id) for u in updates]
        if len(params) == 1:
            self.db.run(conn, sql, params[0])
        else:
            self.db.run(conn, sql, params, many=True)


def reason_text(kind: str, detail: str | None, limit: int = 1000) -> str:
    """``kind: detail`` for ``message_log.reason``, bounded so a huge exception text cannot bloat the row."""
    if not detail:
        return kind
    text = f"{kind}: {detail}"
    return text if len(text) <= limit else text[: limit - 1] + "…"
