"""SQL primitives of the consumer guard for SQLite, PostgreSQL and MariaDB/MySQL.

Why hand-written SQL: the guard runs once per delivery, and an ORM unit of work (or even a Core statement
compiled per call) costs more than a local database round trip. Every statement here is rendered once per
dialect into the driver's own placeholder style and executed on the DBAPI cursor of the caller's SQLAlchemy
``Connection``, inside its transaction, so the handler's ``Session`` (bound to the same ``Connection``) shares
it.

Round trips per primitive (PostgreSQL / SQLite / MariaDB):

* journal: one statement on PostgreSQL (a data-modifying CTE inserts the log rows *and* upserts the
  watermark), two elsewhere; a batch of N deliveries is still one or two statements (multi-row ``VALUES``).
* stub lock: one ``SELECT … FOR UPDATE`` (SQLite: plain ``SELECT``; the engine opened the transaction with
  ``BEGIN IMMEDIATE``, which already holds the database write lock).
* inbox claim: one ``INSERT … ON CONFLICT DO NOTHING RETURNING`` (MariaDB: ``INSERT IGNORE … RETURNING``). A
  concurrent uncommitted insert of the same key makes it wait; when that one commits we get no row back — the
  primary key is the lock (inbox pattern). A single message on PostgreSQL also writes its journal outcome in
  the same statement (:meth:`SqlStore.claim_first`), like the confirm below.
* confirm: one conditional ``UPDATE``; the caller checks the row count.

All timestamps are bound as UTC: aware on PostgreSQL (``timestamptz``), naive UTC on MariaDB, and on SQLite as
text in exactly the format SQLAlchemy's ``DateTime`` writes, so string comparisons in other queries agree.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from reliable.stores import InboxRow, JournalEntry, OutcomeUpdate, StubRow
from reliable.stores.sql_text import (
    INBOX_COLS,
    LOG_COLS,
    OUTCOME_SQL,
    aggregate_progress,
    marks,
    my_progress,
    pg_confirm_record,
    pg_journal,
    pg_progress,
    rows_sql,
    sqlite_progress,
    ts_converter,
)
from reliable.types import LogOutcome, StubStatus

#: prefix of ``message_log.reason`` for a delivery whose handler raised; counted towards ``max_attempts``.
HANDLER_FAILED_PREFIX = "handler_failed"


class SqlStore:
    """The database primitives the guard composes (see the module docstring for the round-trip budget)."""

    def __init__(self, engine: Engine, *, durable_journal: bool = False) -> None:
        self.engine = engine
        #: PostgreSQL only: whether the journal statement waits for its WAL flush (see :meth:`journal`).
        self.durable_journal = durable_journal
        self.dialect = engine.dialect.name
        self._qmark = engine.dialect.paramstyle == "qmark"
        self._pg = self.dialect == "postgresql"
        self._my = self.dialect in ("mysql", "mariadb")
        self._lock = "" if self.dialect == "sqlite" else " FOR UPDATE"
        self._ts: Callable[[dt.datetime], Any] = ts_converter(self.dialect)
        self._cache: dict[tuple[str, int, int], str] = {}
        self._dbapi_error: type[Exception] = engine.dialect.loaded_dbapi.Error

    # --- rendering -----------------------------------------------------------------------------------
    def _sql(self, text: str) -> str:
        """``?`` placeholders in the driver's style (psycopg and PyMySQL take ``%s``)."""
        return text if self._qmark else text.replace("?", "%s")

    def _cached(self, name: str, n: int, build: Callable[[int], str], m: int = 0) -> str:
        """Render once per (statement, row count): the IN-lists and VALUES lists vary only in length."""
        key = (name, n, m)
        sql = self._cache.get(key)
        if sql is None:
            sql = self._cache[key] = self._sql(build(n))
        return sql

    # --- execution ----------------------------------------------------------------------------------
    def _cursor_call(self, conn: Connection, sql: str, params: Any, many: bool, fetch: bool) -> Any:
        """Run one statement on the DBAPI cursor of ``conn``'s connection (inside its transaction).

        ``exec_driver_sql`` costs about as much Python as a local SQLite statement itself, so the guard's own
        statements skip it; driver errors are re-raised as SQLAlchemy's ``DBAPIError`` (and a dropped
        connection is invalidated) exactly as SQLAlchemy would, so callers handle one exception family.
        """
        fairy = conn.connection
        cur = fairy.cursor()
        try:
            if many:
                cur.executemany(sql, params)
            else:
                cur.execute(sql, params)
            return cur.fetchall() if fetch else cur.rowcount
        except self._dbapi_error as exc:
            disconnect = self.engine.dialect.is_disconnect(cast(Any, exc), fairy.dbapi_connection, cur)
            if disconnect:
                conn.invalidate(exc)
            raise DBAPIError.instance(
                sql,
                params,
                exc,
                self._dbapi_error,
                connection_invalidated=disconnect,
                dialect=self.engine.dialect,
            ) from exc
        finally:
            cur.close()

    def _all(self, conn: Connection, sql: str, params: Any) -> list[Any]:
        rows: list[Any] = self._cursor_call(conn, sql, params, False, True)
        return rows

    def _run(self, conn: Connection, sql: str, params: Any, *, many: bool = False) -> int:
        return int(self._cursor_call(conn, sql, params, many, False))

    def execute(self, conn: Connection, sql: str) -> None:
        """A parameterless statement (e.g. ``SET TRANSACTION …``) through the same lean path."""
        self._cursor_call(conn, sql, (), False, False)

    def autocommit(self, conn: Connection, on: bool) -> None:
        """Switch the DBAPI connection's autocommit (PostgreSQL journal); only outside a transaction."""
        conn.connection.driver_connection.autocommit = on  # type: ignore[union-attr]

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
        progress = aggregate_progress(entries)
        prog_params: list[Any] = []
        now = self._ts(entries[0].received_at)
        for (group, topic, queue_id), (hi, lo, count) in progress.items():
            prog_params += (group, topic, queue_id, hi, lo, now, now, count)
        n, m = len(entries), len(progress)
        if self._pg:
            name = "journal_pg_sync" if self.durable_journal else "journal_pg"
            sql = self._cached(name, n, lambda k: pg_journal(k, m, self.durable_journal), m)
            rows = self._all(conn, sql, tuple(log_params + prog_params))
        else:
            sql = self._cached(
                "journal_log",
                n,
                lambda k: f"INSERT INTO message_log ({LOG_COLS}) VALUES {rows_sql(k, 10)} RETURNING id",
            )
            rows = self._all(conn, sql, tuple(log_params))
            build = my_progress if self._my else sqlite_progress
            self._run(conn, self._cached("progress", m, build), tuple(prog_params))
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
            self._run(conn, "SELECT set_config('synchronous_commit', 'off', true)", ())
        sql = self._cached(
            "journal_bulk", 1, lambda _: f"INSERT INTO message_log ({LOG_COLS}) VALUES {rows_sql(1, 10)}"
        )
        self._run(conn, sql, rows, many=True)
        now = self._ts(entries[0].received_at)
        build = pg_progress if self._pg else my_progress if self._my else sqlite_progress
        progress = [
            (group, topic, queue_id, hi, lo, now, now, count)
            for (group, topic, queue_id), (hi, lo, count) in aggregate_progress(entries).items()
        ]
        self._run(conn, self._cached("progress_bulk", 1, build), progress, many=True)

    # --- step 2 helper: what does the database say about a message held by another worker? -------------
    def peek_stubs(self, conn: Connection, message_ids: Iterable[str]) -> dict[str, StubRow]:
        """Read stubs without locking (lease-conflict check)."""
        return self._select_stubs(conn, sorted(set(message_ids)), lock=False)

    # --- step 3: the work transaction ------------------------------------------------------------------
    def lock_stub(self, conn: Connection, message_id: str) -> StubRow | None:
        """``SELECT … FOR UPDATE`` one stub: concurrent deliveries of the same id queue up behind us here."""
        return self._select_stubs(conn, [message_id], lock=True).get(message_id)

    def lock_stubs(self, conn: Connection, message_ids: Sequence[str]) -> dict[str, StubRow]:
        """Lock many stubs in ``message_id`` order (a fixed order, so two batches cannot deadlock)."""
        return self._select_stubs(conn, sorted(set(message_ids)), lock=True)

    def _select_stubs(self, conn: Connection, ids: Sequence[str], *, lock: bool) -> dict[str, StubRow]:
        if not ids:
            return {}
        suffix = self._lock if lock else ""
        sql = self._cached(
            "stubs" + suffix,
            len(ids),
            lambda k: (
                "SELECT message_id, status, payload_hash, consumer_group FROM message_stub "
                f"WHERE message_id IN ({marks(k)}) ORDER BY message_id{suffix}"
            ),
        )
        rows = self._all(conn, sql, tuple(ids))
        return {r[0]: StubRow(StubStatus(r[1]), r[2], r[3]) for r in rows}

    def claim_inbox(self, conn: Connection, rows: Sequence[InboxRow], now: dt.datetime) -> set[str]:
        """Insert ``CONFIRMED`` stubs for messages that have none; return the ids this call inserted.

        An id missing from the result already had a row (possibly inserted and committed by a concurrent
        worker while we waited on its key lock): the caller re-locks and re-reads it.
        """
        if not rows:
            return set()
        rows = sorted(rows, key=lambda r: r.message_id)
        ts = self._ts(now)
        params: list[Any] = []
        for r in rows:
            params += (
                r.message_id,
                r.topic,
                r.tags,
                r.consumer_group,
                r.content,
                r.payload_hash,
                StubStatus.CONFIRMED.value,
                0,
                ts,
                ts,
                ts,
            )
        if self._my:
            head, tail = "INSERT IGNORE INTO", ""
        else:
            head, tail = "INSERT INTO", " ON CONFLICT (message_id) DO NOTHING"
        sql = self._cached(
            "inbox",
            len(rows),
            lambda k: (
                f"{head} message_stub ({INBOX_COLS}) VALUES {rows_sql(k, 11)}{tail} RETURNING message_id"
            ),
        )
        return {r[0] for r in self._all(conn, sql, tuple(params))}

    def confirm(self, conn: Connection, message_ids: Sequence[str], now: dt.datetime) -> int:
        """Conditional confirm of PENDING/DEAD stubs; returns how many rows changed (caller demands all)."""
        if not message_ids:
            return 0
        ts = self._ts(now)
        sql = self._cached(
            "confirm",
            len(message_ids),
            lambda k: (
                "UPDATE message_stub SET status = 'CONFIRMED', confirmed_at = ?, updated_at = ? "
                f"WHERE message_id IN ({marks(k)}) AND status IN ('PENDING', 'DEAD')"
            ),
        )
        return self._run(conn, sql, (ts, ts, *message_ids))

    def confirm_first(
        self,
        conn: Connection,
        message_id: str,
        group: str,
        payload_hash: str | None,
        now: dt.datetime,
        record: OutcomeUpdate,
    ) -> bool:
        """Single-message fast path: confirm the stub *before* the handler runs, in one statement.

        The conditional ``UPDATE`` locks the row like ``SELECT … FOR UPDATE`` would and succeeds only for a
        ``PENDING``/``DEAD`` stub of ``group`` whose recorded hash (if any) matches; on PostgreSQL the same
        statement also writes the journal outcome. If the handler then fails, the rollback undoes both. False
        means "not the happy case" (no stub, already confirmed, voided, other group, other body): nothing was
        changed and the caller takes the general path to find out which.
        """
        ts = self._ts(now)
        cond = (
            "UPDATE message_stub SET status = 'CONFIRMED', confirmed_at = ?, updated_at = ? "
            "WHERE message_id = ? AND status IN ('PENDING', 'DEAD') AND consumer_group = ? "
            f"AND (payload_hash IS NULL OR {'?::varchar' if self._pg else '?'} IS NULL OR payload_hash = ?)"
        )
        params: tuple[Any, ...] = (ts, ts, message_id, group, payload_hash, payload_hash)
        if self._pg:
            sql = self._cached(
                "confirm_first_pg",
                1,
                lambda _: (
                    f"WITH c AS ({cond} RETURNING 1), o AS (UPDATE message_log SET outcome = ?, "
                    "reason = ? WHERE id = ? AND EXISTS (SELECT 1 FROM c)) SELECT count(*) FROM c"
                ),
            )
            rows = self._all(conn, sql, (*params, record.outcome.value, record.reason, record.log_id))
            return int(rows[0][0]) == 1
        if self._run(conn, self._cached("confirm_first", 1, lambda _: cond), params) != 1:
            return False
        self.set_outcomes(conn, [record])
        return True

    @property
    def claims_with_outcome(self) -> bool:
        """Whether :meth:`claim_first` writes the journal outcome in the claiming statement (PostgreSQL)."""
        return self._pg

    def claim_first(self, conn: Connection, row: InboxRow, now: dt.datetime, record: OutcomeUpdate) -> bool:
        """Single-message inbox fast path (PostgreSQL): claim the inbox row and write the outcome at once.

        The counterpart of :meth:`confirm_first` for producers without stubs: one data-modifying CTE inserts
        the ``CONFIRMED`` row (``ON CONFLICT DO NOTHING``) and, only if it did, records ``record`` on the
        journal row — before the handler runs, so the commit after it is the only round trip left; a handler
        failure rolls both back. False: the id already had a row (nothing changed); the caller locks and
        judges it.
        """
        ts = self._ts(now)
        sql = self._cached(
            "claim_first_pg",
            1,
            lambda _: (
                f"WITH c AS (INSERT INTO message_stub ({INBOX_COLS}) VALUES {rows_sql(1, 11)} "
                "ON CONFLICT (message_id) DO NOTHING RETURNING 1), o AS (UPDATE message_log SET outcome = ?, "
                "reason = ? WHERE id = ? AND EXISTS (SELECT 1 FROM c)) SELECT count(*) FROM c"
            ),
        )
        params = (
            row.message_id,
            row.topic,
            row.tags,
            row.consumer_group,
            row.content,
            row.payload_hash,
            StubStatus.CONFIRMED.value,
            0,
            ts,
            ts,
            ts,
            record.outcome.value,
            record.reason,
            record.log_id,
        )
        return int(self._all(conn, sql, params)[0][0]) == 1

    def confirm_and_record(
        self, conn: Connection, message_ids: Sequence[str], now: dt.datetime, updates: Sequence[OutcomeUpdate]
    ) -> int:
        """:meth:`confirm` plus :meth:`set_outcomes` — one statement on PostgreSQL (two data-modifying CTEs).

        Returns the number of stubs confirmed; the caller rolls everything back unless it is all of them.
        """
        if not self._pg or not updates:
            changed = self.confirm(conn, message_ids, now)
            self.set_outcomes(conn, updates)
            return changed
        n, m = len(message_ids), len(updates)
        sql = self._cached("confirm_record_pg", n, lambda k: pg_confirm_record(k, m), m)
        ts = self._ts(now)
        params: list[Any] = [ts, ts, *message_ids] if n else []
        for u in updates:
            params += (u.log_id, u.outcome.value, u.reason)
        rows = self._all(conn, sql, tuple(params))
        return int(rows[0][0]) if rows else 0

    def unclaim_inbox(self, conn: Connection, message_ids: Sequence[str]) -> None:
        """Delete inbox rows this transaction inserted for messages whose handler then failed (batch mode)."""
        if not message_ids:
            return
        sql = self._cached(
            "unclaim",
            len(message_ids),
            lambda k: f"DELETE FROM message_stub WHERE message_id IN ({marks(k)}) AND status = 'CONFIRMED'",
        )
        self._run(conn, sql, tuple(message_ids))

    # --- outcomes ---------------------------------------------------------------------------------------
    def set_outcomes(self, conn: Connection, updates: Sequence[OutcomeUpdate]) -> None:
        """Fill ``message_log.outcome``/``reason`` (one statement; executemany pipelines on psycopg)."""
        if not updates:
            return
        sql = self._cached("outcome", 1, lambda _: OUTCOME_SQL)
        params = [(u.outcome.value, u.reason, u.log_id) for u in updates]
        if len(params) == 1:
            self._run(conn, sql, params[0])
        else:
            self._run(conn, sql, params, many=True)

    def count_handler_failures(self, conn: Connection, message_id: str, group: str) -> int:
        """Earlier deliveries of this message to this group whose handler raised (cold path only)."""
        sql = self._cached(
            "failures",
            1,
            lambda _: (
                "SELECT COUNT(*) FROM message_log WHERE message_id = ? AND consumer_group = ? "
                "AND outcome = ? AND reason LIKE ?"
            ),
        )
        rows = self._all(conn, sql, (message_id, group, LogOutcome.RETRY.value, HANDLER_FAILED_PREFIX + "%"))
        return int(rows[0][0]) if rows else 0


def reason_text(kind: str, detail: str | None, limit: int = 1000) -> str:
    """``kind: detail`` for ``message_log.reason``, bounded so a huge exception text cannot bloat the row."""
    if not detail:
        return kind
    text = f"{kind}: {detail}"
    return text if len(text) <= limit else text[: limit - 1] + "…"
