"""Step 3 of the consumer guard — the work transaction — as a collaborator the guard owns.

What it does (DESIGN.md §2 step 3, per ``(group, message_id)``): lock the group's inbox row or insert it
(inbox pattern: the primary key admits one writer per group), judge it
(:func:`reliable.guard.decision.judge`), run the handler with a ``Session`` on the guard's connection, and
confirm the row and record the outcome in the same transaction. The decisions are the pure functions of
:mod:`reliable.guard.decision` and :mod:`reliable.guard.plan`; this class only does the synchronous I/O.

Performance tricks kept from the seed: a single message tries the happy case in one statement first
(:meth:`SqlStore.confirm_first` confirms *before* the handler, holding the row lock; a handler failure rolls
it back), a batch runs optimistically without savepoints until a handler fails, and the guard learns whether
deliveries usually come without a producer row (then it inserts first, saving the lookup that finds nothing).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, event
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from reliable import constants as C
from reliable.guard.db_errors import DEADLOCK_MARK, disconnect_in, is_deadlock, note_deadlock, own_cancel_in
from reliable.guard.decision import GuardHooks, HandlerCancelled, Reason, Verdict
from reliable.guard.plan import Item, decide, decide_verdict, journal_entry, judge_row, outcome_update, undo
from reliable.metrics import GuardMetrics
from reliable.models import utcnow
from reliable.stores import InboxState, JournalEntry
from reliable.stores.sql import FirstStep, SqlStore
from reliable.types import Envelope, LogOutcome

log = logging.getLogger(C.GUARD_LOGGER)

Handler = Callable[[Envelope, Session], None]


class HandlerFailed(Exception):
    """Internal: unwinds a savepoint-less work transaction after a handler raised."""


class StaleConnection(Exception):
    """The connection was found dead by the transaction's first statement: nothing ran, nothing was written.

    The pool checks a connection at checkout without a round trip (:mod:`reliable.pool_liveness`), so a
    session the server killed a moment ago can still reach here; the guard retries the work transaction once
    on a fresh connection instead of answering the delivery ``database_unavailable``."""


class LostUnderHandler(SQLAlchemyError):
    """The guard's connection died while the handler ran (a failover, a killed session): an outage, answered
    ``database_unavailable`` by :meth:`WorkTransaction.run` like any failed statement of the guard's — not a
    handler failure, so no attempt is counted (DESIGN.md §2 step 5). Not a cancel of an ``async def``
    handler's task that lands in its own statement (:class:`HandlerCancelled`): that invalidates the
    connection too, but it is the handler's failure."""


class ConfirmConflict(Exception):
    """Internal: the conditional confirm changed fewer rows than expected; the transaction rolls back."""


class WorkTransaction:
    """Runs step 3 for the deliveries of one guard (group); one instance per guard, thread-safe."""

    def __init__(
        self,
        sql: SqlStore,
        group: str,
        handler: Handler,
        hooks: Sequence[GuardHooks],
        metrics: GuardMetrics,
        max_attempts: int,
    ) -> None:
        self.sql = sql
        self.max_attempts = max_attempts
        self.group = group
        self.handler = handler
        self.hooks = tuple(hooks)
        self.metrics = metrics
        self._mariadb = sql.dialect in ("mysql", "mariadb")
        self._postgres = sql.dialect == "postgresql"
        if self._mariadb and not event.contains(sql.engine, "handle_error", note_deadlock):
            # a dialect-level hook: it runs only when a statement fails, and costs the others nothing
            event.listen(sql.engine, "handle_error", note_deadlock)
        # Learned: when most recent deliveries had no producer row, insert the inbox row first (one round
        # trip fewer). Not on MariaDB: there INSERT IGNORE share-locks an existing row and the FOR UPDATE that
        # follows could deadlock with a twin delivery.
        self._adaptive = not self._mariadb
        self._inbox_first = False
        self._local = threading.local()

    def run(self, conn: Connection, items: Sequence[Item]) -> None:
        """Run the work transaction; a batch is optimistic (no savepoints) until a handler fails.

        The transaction journals the deliveries it runs (``message_log`` rows first, the watermark last), so
        a new message costs one commit. Whatever it does not commit — a failed handler, a rollback — the
        guard journals afterwards (:meth:`reliable.guard.core.Guard._settle`).

        Savepoints cost two round trips per message, which is most of what batching saves, so the first
        attempt runs every handler in one plain transaction. If a handler raises, the whole transaction is
        rolled back, the failed delivery is set aside, and the rest run again with a savepoint each. Their
        database writes were rolled back, so they still happen once; effects outside the database repeat
        (they are at-least-once anyway).
        """
        run = [it for it in items if it.decision is None and it.twin_of is None]
        savepoints = False
        deadlocks = 0
        while run:
            for it in run:
                it.decision, it.claimed, it.verdict, it.log_id, it.ran = None, False, None, None, False
            attempt, committed = run, False
            try:
                with self.sql.transaction(conn, pipelined_begin=True):  # _open sends BEGIN with its statement
                    self._transaction(conn, run, savepoints)
                committed = True
                for it in run:  # a handler that failed in savepoint mode has a row but no outcome yet
                    it.written = it.decision is not None
                return
            except HandlerFailed:  # rolled back as a whole; the guard's settle step decides the failed one
                run = [it for it in run if it.error is None]
                savepoints = True
            except ConfirmConflict as exc:
                undo(run, Reason.CONFIRM_CONFLICT, str(exc))
                return
            except IntegrityError as exc:
                if not any(it.ran for it in run):
                    self._down(run, exc)
                    return
                # the handlers' writes broke a constraint checked only now (DEFERRABLE INITIALLY DEFERRED):
                # a handler failure, not an outage — answered as one it would be redelivered for ever. One
                # handler (or already one savepoint each) is blamed; a batch runs again with a savepoint
                # each, on PostgreSQL with every constraint immediate, so the one that breaks it fails alone
                if len(run) == 1 or savepoints:
                    for it in run:
                        if it.ran:  # its PROCESSED was rolled back with everything else
                            it.decision = None
                            self._failed(it, exc)
                    run = [it for it in run if it.error is None]
                savepoints = True
            except DBAPIError as exc:
                if is_deadlock(exc) and deadlocks < C.GUARD_DEADLOCK_RETRIES:
                    # two transactions each wanted a row the other held; the database rolled this one back
                    # in full, so running it again is what a redelivery would do, without the broker's wait
                    deadlocks += 1
                    self.metrics.database_errors.labels(self.group, "deadlock_retried").inc()
                    # a handler that failed in this run (savepoint mode) stays failed: its failure is the
                    # settle step's, as after HandlerFailed; run again, its error would still be set and its
                    # committed write left unconfirmed — applied again at the redelivery
                    run = [it for it in run if it.error is None]
                    log.info(
                        "guard work transaction chosen as a deadlock victim (group %s); running it again",
                        self.group,
                    )
                    continue
                self._down(run, exc)
                return
            except SQLAlchemyError as exc:
                self._down(run, exc)
                return
            finally:
                if not committed:  # rolled back: the settle step journals them again
                    for it in attempt:
                        it.log_id = None

    def _down(self, run: list[Item], exc: SQLAlchemyError) -> None:
        self.metrics.database_errors.labels(self.group, "work").inc()
        log.warning("guard work transaction failed (group %s): %r", self.group, exc)
        undo(run, Reason.DATABASE_UNAVAILABLE, repr(exc)[:300])

    def _transaction(self, conn: Connection, run: list[Item], savepoints: bool) -> None:
        now = utcnow()
        entries = [journal_entry(it, self.group, now) for it in run]
        try:
            recorded, settled = self._open(conn, run, entries, now, savepoints)
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise StaleConnection(repr(exc)[:300]) from exc
            raise
        if savepoints and self._postgres:  # each handler's constraint failure is its own (see run())
            self.sql.execute(conn, "SET CONSTRAINTS ALL IMMEDIATE")
        for h in self.hooks:
            h.after_journal([it.env for it in run], [it.log_id or 0 for it in run])
        states: dict[str, InboxState] = {}
        if recorded:
            pass  # confirmed or claimed, outcome written: only the handler is left
        elif run[0].verdict is Verdict.RUN_INBOX:  # the happy case lost its claim: a row exists, lock it
            run[0].verdict = None
            states = self.sql.lock_inbox(conn, self.group, [run[0].mid])
            self._inbox_first = False
        elif self._inbox_first:
            states = self._claim_then_lock(conn, run, now)
        else:
            states = self._lock_then_claim(conn, run, now)
        fatal_here = functools.partial(self.sql.log.dead_lettered_at, conn)
        for it in run:
            if not recorded:
                it.verdict = judge_row(it, states.get(it.mid), self.max_attempts, self.group, fatal_here)
            if it.verdict is Verdict.RUN or it.verdict is Verdict.RUN_INBOX:
                self._run_handler(conn, it, savepoint=savepoints)
            elif it.verdict is not None:
                decide_verdict(it, it.verdict, states.get(it.mid))
        ok = [it for it in run if it.decision is None and it.error is None]
        for it in ok:
            decide(it, Reason.PROCESSED)
        self.sql.unclaim_inbox(
            conn, self.group, [it.mid for it in run if it.error is not None and it.claimed]
        )
        if recorded:
            if not settled:  # another group may be confirming the same message right now
                self.sql.settle_exact(conn, self.group, [run[0].mid], now)
        else:
            to_confirm = [it.mid for it in ok if it.verdict is Verdict.RUN]
            updates = [outcome_update(it) for it in run if it.decision is not None]
            changed, n_settled = self.sql.confirm_and_record(conn, self.group, to_confirm, now, updates)
            if changed != len(to_confirm):
                raise ConfirmConflict(f"confirm changed {changed} of {len(to_confirm)} inbox rows")
            if n_settled < changed and not self.sql.settles_exactly:  # as above, for this batch's rows
                self.sql.settle_exact(conn, self.group, to_confirm, now)
        self.sql.log.progress(conn, entries, commit=True)

    def _open(
        self, conn: Connection, run: list[Item], entries: list[JournalEntry], now: Any, savepoints: bool
    ) -> tuple[bool, bool]:
        """The transaction's first statement(s): journal rows, and for one message the happy case.

        Only without savepoints, because the happy case confirms before the handler and needs a handler
        failure to roll back the whole transaction; a savepoint would undo the handler's writes but keep the
        confirm. Returns (recorded, stub settled) as :meth:`_happy_case_first`.
        """
        self.sql.no_gap_locks(conn)  # MariaDB: two inserts of one key wait, not deadlock
        if len(run) == 1 and not savepoints:
            return self._happy_case_first(conn, run[0], entries[0], now)
        for it, log_id in zip(run, self.sql.log.log_rows(conn, entries, begin=True), strict=True):
            it.log_id = log_id
        return False, True

    def _happy_case_first(
        self, conn: Connection, it: Item, entry: JournalEntry, now: Any
    ) -> tuple[bool, bool]:
        """One message: journal it and confirm its inbox row (or claim one) with the outcome, in one go.

        Returns (done, stub settled) and sets ``it.verdict`` to RUN / RUN_INBOX when it was done. A lost claim
        leaves RUN_INBOX with done False, telling the caller a row exists and must be locked and judged.
        """
        claim = self._inbox_first
        first = FirstStep(self.group, it.inbox_row, claim, now, LogOutcome.SUCCESS, Reason.PROCESSED.value)
        it.log_id, changed, settled = self.sql.journal_first(conn, entry, first)
        if claim:
            it.verdict, it.claimed = Verdict.RUN_INBOX, changed
            return changed, True  # a claimed row has no producer stub to settle
        if changed:
            it.verdict = Verdict.RUN
        return changed, settled

    def _lock_then_claim(self, conn: Connection, run: list[Item], now: Any) -> dict[str, InboxState]:
        """Producer rows expected: lock them; insert inbox rows only for ids the group has none of."""
        states = self.sql.lock_inbox(conn, self.group, [it.mid for it in run])
        missing = [it for it in run if it.mid not in states]
        if missing:
            claimed = self.sql.claim_inbox(conn, self.group, [it.inbox_row for it in missing], now)
            for it in missing:
                it.claimed = it.mid in claimed
            lost = [it.mid for it in missing if not it.claimed]
            if lost:  # a concurrent worker inserted it while we waited: read what it committed
                states.update(self.sql.read_claim_losers(conn, self.group, lost))
        self._inbox_first = self._adaptive and 2 * len(missing) > len(run)
        return states

    def _claim_then_lock(self, conn: Connection, run: list[Item], now: Any) -> dict[str, InboxState]:
        """No producer rows lately (inbox pattern): insert first, saving the lookup that finds nothing.

        ``ON CONFLICT DO NOTHING`` takes no lock on an existing row, so ids that turn out to have one are then
        locked with ``FOR UPDATE`` exactly as in :meth:`_lock_then_claim`.
        """
        claimed = self.sql.claim_inbox(conn, self.group, [it.inbox_row for it in run], now)
        for it in run:
            it.claimed = it.mid in claimed
        rest = [it.mid for it in run if not it.claimed]
        states = self.sql.lock_inbox(conn, self.group, rest) if rest else {}
        self._inbox_first = 2 * len(claimed) >= len(run)
        return states

    def _run_handler(self, conn: Connection, it: Item, *, savepoint: bool) -> None:
        sp = conn.begin_nested() if savepoint else None
        for h in self.hooks:
            h.before_handler(it.env)
        session = self._session(conn)
        it.after_commit = session.info[C.SESSION_AFTER_COMMIT] = []  # what it stages is sent after the commit
        err: Exception | None = None
        it.ran = True
        if self._mariadb:
            conn.info.pop(DEADLOCK_MARK, None)
        try:
            self.handler(it.env, session)
            session.flush()
        except Exception as exc:  # the handler's fault, whatever it is: counted, logged, retried
            err = exc
        finally:
            session.close()
            session.info.pop(C.SESSION_AFTER_COMMIT, None)  # (async deliveries share this session object)
        if err is None and self._postgres and _aborted(conn):
            err = RuntimeError(
                "the handler caught a database error and went on, but PostgreSQL aborted the transaction: "
                "run a statement that may fail inside session.begin_nested()"
            )
        if err is None and self._mariadb and conn.info.pop(DEADLOCK_MARK, False):
            err = RuntimeError(
                "the handler caught a deadlock and went on, but InnoDB rolled back the whole transaction, "
                "the guard's rows with it: let the error propagate (the message is retried)"
            )
        if err is None:
            tx = sp if sp is not None else conn.get_transaction()
            if tx is None or not tx.is_active:
                err = RuntimeError("handler rolled back the guard's transaction (session.rollback())")
        for h in self.hooks:
            h.after_handler(it.env, err)
        if err is None:
            if sp is not None:
                sp.commit()
            return
        # the connection died under the handler (a failover, a killed session): an outage, not the handler's
        # failure — unless what invalidated it was a cancel the handler itself asked for (its own
        # ``asyncio.timeout`` around a statement), whose TimeoutError is the handler's failure like any other
        disconnected = disconnect_in(err)
        lost = conn.invalidated or disconnected
        outage = disconnected or (conn.invalidated and not own_cancel_in(err))
        if outage and not isinstance(err, HandlerCancelled):
            raise LostUnderHandler(repr(err)[:300]) from err
        # a cancel that lands in the handler's own statement invalidates the connection too (SQLAlchemy
        # cannot tell where the statement stopped): still the handler's failure, counted like any other; the
        # whole transaction is gone with the connection, and the settle step's first statement reconnects
        self._failed(it, err)
        if sp is None or lost:
            raise HandlerFailed
        if sp.is_active:
            sp.rollback()
        # savepoint mode: the others carry on in the same transaction

    def _failed(self, it: Item, err: Exception) -> None:
        """Count a handler failure; the guard's settle step decides the delivery."""
        it.error = err
        it.after_commit = []  # its writes are rolled back: nothing it staged exists
        self.metrics.handler_failures.labels(self.group).inc()
        log.warning("handler failed message_id=%s group=%s: %r", it.mid, self.group, err, exc_info=err)

    def _session(self, conn: Connection) -> Session:
        """A per-thread ``Session`` re-bound to this delivery's connection (constructing one costs more than
        the statements of a small handler). ``close()`` after each handler empties it again."""
        session: Session | None = getattr(self._local, "session", None)
        if session is None:
            session = Session(join_transaction_mode="rollback_only", expire_on_commit=False)
            self._local.session = session
        session.bind = conn
        return session


def _aborted(conn: Connection) -> bool:
    """PostgreSQL refuses every statement of a transaction after one failed: a handler that caught a
    database error and went on has left the guard a transaction it can only roll back. Read from psycopg's
    view of the session (no round trip); other drivers answer ``False``."""
    info = getattr(conn.connection.driver_connection, "info", None)
    status = getattr(info, "transaction_status", None)
    return getattr(status, "name", "") == "INERROR"
