"""Write-behind journal for deliveries Redis already answers as ``done`` (``journal_write_behind``).

On by default for the sync guard (setting ``None``); ``False`` turns it off, the async guard never uses it.

Every other delivery's journal row commits in the guard's own transaction (with the work, or with the failure
record). For a delivery whose key already says ``done`` there is no such transaction: the first delivery's row
(committed with its work) already proves arrival, and its effect is committed. What is
left to record is *evidence of the duplicate* — useful for the reconciliation report and dashboards, not for
any guarantee. So such rows may wait in memory and be written many at a time, in one transaction (one
pipelined ``executemany`` plus the watermark upsert), instead of one commit per duplicate.

When rows are written: as soon as ``max_rows`` are buffered (by the delivering thread, synchronously), at the
latest ``max_ms`` after the oldest buffered row (by a daemon thread), on :meth:`JournalBuffer.flush`, on
:meth:`JournalBuffer.close`, and at interpreter exit.

What a crash (``kill -9``, power loss) can lose: at most the buffered rows — ``message_log`` rows with
outcome ``DUPLICATE`` of deliveries answered by the ``done`` marker — and the part of a
``consume_progress`` advance that came *only* from those duplicates. Never a first delivery's row, never a
row of a delivery whose handler ran or failed, and never the watermark raised by a first delivery: those stay
synchronous. A lost watermark advance can only make the sweeper *more* patient (it resends a PENDING stub only
once the watermark has passed its offset), and the next synchronously journaled delivery on that queue raises
it again; the stubs of the lost duplicates are ``CONFIRMED`` already, so nothing is resent because of them.
A lost row leaves its offset without a journal row: the reconciliation report shows it as an offset gap.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from reliable.stores import JournalEntry, call_at_exit
from reliable.stores.sql import SqlStore

log = logging.getLogger("reliable.guard")

#: rows kept for a retry after a failed flush; beyond this the oldest are dropped (and counted).
_KEEP_FACTOR = 20


class JournalBuffer:
    """Buffer :class:`JournalEntry` rows and write them in batches (thread-safe; one per guard)."""

    def __init__(
        self,
        engine: Engine,
        sql: SqlStore,
        *,
        max_rows: int,
        max_ms: int,
        on_error: Callable[[int, BaseException], None] | None = None,
    ) -> None:
        self._engine = engine
        self._sql = sql
        self.max_rows = max_rows
        self.max_s = max_ms / 1000.0
        self._on_error = on_error
        self._rows: list[JournalEntry] = []
        self._cond = threading.Condition()
        self._flushing = threading.Lock()  # one flush at a time keeps rows in arrival order
        self._closed = False
        self._thread: threading.Thread | None = None
        call_at_exit(self.close)

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, entries: list[JournalEntry]) -> None:
        """Buffer ``entries``; flush in this thread if the buffer is full, else make sure the timer runs.

        After :meth:`close` the rows are written at once (a late delivery during shutdown is not dropped).
        """
        with self._cond:
            closed = self._closed
            if not closed:
                was_empty = not self._rows
                self._rows += entries
                full = len(self._rows) >= self.max_rows
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="reliable-journal-behind", daemon=True
                    )
                    self._thread.start()
                if was_empty:
                    self._cond.notify()
        if closed:
            self._write(entries)
        elif full:
            self.flush()

    def flush(self) -> int:
        """Write every buffered row now (one transaction); returns how many were written."""
        with self._flushing:
            with self._cond:
                rows, self._rows = self._rows, []
            if not rows:
                return 0
            if self._write(rows):
                return len(rows)
            with self._cond:  # keep them for the next attempt, bounded
                self._rows = (rows + self._rows)[-self.max_rows * _KEEP_FACTOR :]
            return 0

    def close(self) -> None:
        """Stop the timer thread and write what is left (idempotent)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self.flush()

    # --- internals ------------------------------------------------------------------------------------
    def _write(self, rows: list[JournalEntry]) -> bool:
        try:
            with self._engine.connect() as conn, conn.begin():
                self._sql.log.journal_bulk(conn, rows)
        except SQLAlchemyError as exc:
            log.warning("write-behind journal: could not write %d duplicate rows: %r", len(rows), exc)
            if self._on_error is not None:
                self._on_error(len(rows), exc)
            return False
        return True

    def _run(self) -> None:
        """Timer: once rows are waiting, flush them at most ``max_ms`` later."""
        while True:
            with self._cond:
                while not self._rows and not self._closed:
                    self._cond.wait()
                deadline = time.monotonic() + self.max_s
                while not self._closed and self._rows and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
                if self._closed:
                    return
            self.flush()
