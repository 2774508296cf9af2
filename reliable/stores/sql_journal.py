"""The journal's SQL — ``message_log`` rows, ``consume_progress`` watermarks, outcomes — built in ONE place.

Why a module of its own: every path that journals (the work transaction, the settle transaction, the
write-behind flush, the single-message opener in :meth:`reliable.stores.sql.SqlStore.journal_first`) builds
its rows with :meth:`JournalSql.row` and :meth:`JournalSql.progress_rows` and its SQL with the builders of
:mod:`reliable.stores.sql_text` (``LOG_COLS``, ``PROGRESS_COLS``), so a new journal column is added here and
there only.

Where the statements go (issue 18): the log rows are the *first* statement of the guard's transaction and the
watermark upsert its *last* (its row is shared by every delivery of the queue: taken last, its lock is held
only while the transaction commits). On psycopg the first carries ``BEGIN`` and the last ``COMMIT`` (see
:class:`reliable.stores.sql_runner.DbapiRunner`); a journal with nothing else to do is one self-committing
statement (:meth:`JournalSql.journal_alone`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from reliable.stores import JournalEntry, OutcomeUpdate
from reliable.stores import sql_text as T
from reliable.stores.sql_runner import DbapiRunner
from reliable.stores.sql_text import (
    DEAD_LETTER_AT_SQL,
    DEAD_LETTER_ON_TOPIC_SQL,
    OUTCOME_SQL,
    aggregate_progress,
    my_progress,
    sqlite_progress,
)


class JournalSql:
    """Journal statements on one engine's runner (owned by :class:`reliable.stores.sql.SqlStore`)."""

    def __init__(self, db: DbapiRunner, *, durable_journal: bool = False) -> None:
        self.db = db
        #: PostgreSQL only: whether the write-behind flush waits for its WAL flush (see :meth:`journal_bulk`)
        self.durable_journal = durable_journal
        self._pg = db.dialect == "postgresql"
        self._my = db.dialect in ("mysql", "mariadb")
        self._ts = db.ts

    def journal(self, conn: Connection, entries: Sequence[JournalEntry]) -> list[int]:
        """Insert one ``message_log`` row per entry and raise the ``consume_progress`` watermarks.

        Returns the new log ids in the order of ``entries``. Runs inside the caller's transaction (the guard
        splits it into :meth:`log_rows` first and :meth:`progress` last, see there).
        """
        ids = self.log_rows(conn, entries)
        self.progress(conn, entries)
        return ids

    def log_rows(
        self, conn: Connection, entries: Sequence[JournalEntry], *, begin: bool = False
    ) -> list[int]:
        """Insert the ``message_log`` rows (one statement); ``begin``: this statement opens the transaction.

        Ids come from one sequence/auto-increment in VALUES order, so sorting restores entry order even where
        RETURNING does not promise it.
        """
        if not entries:
            return []
        params: list[Any] = []
        for e in entries:
            params += self.row(e)
        sql = self.db.cached("journal_log", len(entries), T.log_insert)
        return sorted(int(r[0]) for r in self.db.all(conn, sql, tuple(params), begin=begin))

    def progress(self, conn: Connection, entries: Sequence[JournalEntry], *, commit: bool = False) -> None:
        """Raise the watermark of each delivered queue: one upsert, the last statement of the transaction.

        Last, because the watermark row is shared by every delivery of the queue: taken at the end, its row
        lock is held only while the transaction commits, not while a handler runs. Rows go in key order, so
        two batches that span the same queues lock them in the same order. ``commit``: ``COMMIT`` rides on
        this statement (PostgreSQL, see :meth:`transaction`).
        """
        if not entries:
            return
        rows = self.progress_rows(entries)
        build = T.pg_progress if self._pg else my_progress if self._my else sqlite_progress
        params: list[Any] = [v for row in rows for v in row]
        self.db.run(conn, self.db.cached("progress", len(rows), build), tuple(params), commit=commit)

    def journal_alone(
        self, conn: Connection, entries: Sequence[JournalEntry], *, opened: bool = False
    ) -> list[int]:
        """Journal rows + watermarks as the rest of a transaction (``opened``) or as the whole of it.

        The whole of it, on PostgreSQL: one statement (a data-modifying CTE of the same two statements) that
        commits by itself — no ``BEGIN``, no ``COMMIT`` round trip. Elsewhere the caller commits.
        """
        if not entries:
            return []
        if opened or not self.db.piggybacks:
            ids = self.log_rows(conn, entries)
            self.progress(conn, entries, commit=opened)
            return ids
        params: list[Any] = []
        for e in entries:
            params += self.row(e)
        rows = self.progress_rows(entries)
        params += [v for row in rows for v in row]
        sql = self.db.cached("journal_alone", len(entries), lambda k: T.pg_journal(k, len(rows)), len(rows))
        return sorted(int(r[0]) for r in self.db.all(conn, sql, tuple(params)))

    def progress_rows(self, entries: Sequence[JournalEntry]) -> list[tuple[Any, ...]]:
        """One watermark row per queue, in ``PROGRESS_COLS`` order, sorted by key."""
        now = self._ts(entries[0].received_at)
        return [
            (*key, hi, lo, now, now, count)
            for key, (hi, lo, count) in sorted(aggregate_progress(entries).items())
        ]

    def row(self, e: JournalEntry) -> tuple[Any, ...]:
        """One ``message_log`` row's values, in ``LOG_COLS`` order (every journal path builds rows here)."""
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
        """The rows of the write-behind journal's large flushes (duplicates answered by Redis) + watermarks.

        One single-row ``INSERT`` run with ``executemany`` (psycopg pipelines it into one round trip and
        prepares it once, where a fresh 200-row ``VALUES`` list would be parsed and planned every time) plus
        one watermark upsert per queue. On PostgreSQL the flush does not wait for its WAL flush unless
        ``durable_journal``: losing these rows in a server crash loses only evidence of duplicates.
        """
        if not entries:
            return
        rows = [self.row(e) for e in entries]
        if self._pg and not self.durable_journal:
            self.db.run(conn, "SELECT set_config('synchronous_commit', 'off', true)", ())
        self.db.run(conn, self.db.cached("journal_bulk", 1, T.log_insert_bare), rows, many=True)
        build = T.pg_progress if self._pg else my_progress if self._my else sqlite_progress
        self.db.run(conn, self.db.cached("progress_bulk", 1, build), self.progress_rows(entries), many=True)

    def dead_lettered_at(self, conn: Connection, e: JournalEntry, anywhere: bool = False) -> bool:
        """Whether ``e``'s group journaled a ``DEAD_LETTER`` for its message at ``e``'s delivered position:
        ``e`` is then a redelivery of a record the group dead-lettered (asked only of a copy the guard would
        otherwise answer as a duplicate of a dead row, never on the way of a live message). ``anywhere``:
        at any position of its topic (``e.original_topic``) — ``e`` came at a new position the broker gave a
        redelivery (RocketMQ 5.x's pop retry topic), so the record it may redeliver was journaled elsewhere.
        """
        if anywhere:
            topic = e.original_topic if e.original_topic is not None else e.topic
            sql = self.db.cached("dead_letter_on_topic", 1, lambda _: DEAD_LETTER_ON_TOPIC_SQL)
            return bool(self.db.all(conn, sql, (e.message_id, e.consumer_group, topic)))
        params = (e.message_id, e.consumer_group, e.topic, e.broker_name, e.queue_id, e.queue_offset)
        return bool(
            self.db.all(conn, self.db.cached("dead_letter_at", 1, lambda _: DEAD_LETTER_AT_SQL), params)
        )

    def set_outcomes(self, conn: Connection, updates: Sequence[OutcomeUpdate]) -> None:
        """Fill ``message_log.outcome``/``reason``: one statement (several rows: ``CASE id WHEN …``, because
        PyMySQL would send an ``executemany`` of an ``UPDATE`` row by row)."""
        if not updates:
            return
        if len(updates) == 1:
            u = updates[0]
            self.db.run(
                conn,
                self.db.cached("outcome", 1, lambda _: OUTCOME_SQL),
                (u.outcome.value, u.reason, u.log_id),
            )
            return
        params: list[Any] = []
        for u in updates:
            params += (u.log_id, u.outcome.value)
        for u in updates:
            params += (u.log_id, u.reason)
        params += [u.log_id for u in updates]
        self.db.run(conn, self.db.cached("outcomes", len(updates), T.outcomes_case), tuple(params))
