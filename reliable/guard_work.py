"""Step 3 of the consumer guard — the work transaction — and the per-delivery state the steps share.

Split from :mod:`reliable.guard` to keep each module readable; :class:`WorkStep` is a mixin of
:class:`reliable.guard.Guard` and uses the attributes declared on it below. What it does: lock the stub or
claim an inbox row, judge it, run the handler with a ``Session`` on the guard's connection, and confirm the
stub and record the outcome in the same transaction (DESIGN.md §2 step 3).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from reliable import constants as C
from reliable.decision import Decision, GuardHooks, Reason, Verdict, judge, verdict_decision
from reliable.metrics import GuardMetrics
from reliable.models import utcnow
from reliable.stores import InboxRow, OutcomeUpdate, StubRow
from reliable.stores.sql import SqlStore, reason_text
from reliable.types import Envelope, LogOutcome

log = logging.getLogger(C.GUARD_LOGGER)

Handler = Callable[[Envelope, Session], None]


@dataclass(slots=True)
class Item:
    """Mutable per-delivery state while a batch moves through the steps."""

    env: Envelope
    mid: str
    payload_hash: str | None
    key: str = ""
    lease_value: str = ""
    owned: bool = False  # we hold processing:{owner} and must mark done or release
    verdict: Verdict | None = None
    claimed: bool = False
    twin_of: Item | None = None  # same id earlier in this batch
    log_id: int | None = None
    decision: Decision | None = None
    error: BaseException | None = None
    written: bool = False  # the journal row carries the final outcome
    held: bool = False  # the fast path found a live lease of another worker
    worker: str = ""


class HandlerFailed(Exception):
    """Internal: unwinds a savepoint-less work transaction after a handler raised."""


class ConfirmConflict(Exception):
    """Internal: the conditional confirm changed fewer rows than expected; the transaction rolls back."""


class WorkStep:
    """The work transaction (mixin of :class:`reliable.guard.Guard`, which sets these attributes)."""

    group: str
    handler: Handler
    sql: SqlStore
    metrics: GuardMetrics
    hooks: tuple[GuardHooks, ...]
    _mariadb: bool
    _adaptive: bool
    _inbox_first: bool
    _local: threading.local

    # --- step 3: the work transaction ---------------------------------------------------------------
    def _work(self, conn: Connection, items: list[Item]) -> None:
        """Run the work transaction; a batch is optimistic (no savepoints) until a handler fails.

        Savepoints cost two round trips per message, which is most of what batching saves, so the first
        attempt runs every handler in one plain transaction. If a handler raises, the whole transaction is
        rolled back, the failed delivery is set aside, and the rest run again with a savepoint each. Their
        database writes were rolled back, so they still happen once; effects outside the database repeat
        (they are at-least-once anyway).
        """
        run = [it for it in items if it.decision is None and it.twin_of is None]
        savepoints = False
        while run:
            for it in run:
                it.decision, it.claimed, it.verdict = None, False, None
            try:
                with conn.begin():
                    self._work_txn(conn, run, savepoints)
                for it in run:
                    it.written = it.decision is not None
                return
            except HandlerFailed:  # rolled back as a whole; _settle decides the failed one
                run = [it for it in run if it.error is None]
                savepoints = True
            except ConfirmConflict as exc:
                self._undo(run, Reason.CONFIRM_CONFLICT, str(exc))
                return
            except SQLAlchemyError as exc:
                self.metrics.database_errors.labels(self.group, "work").inc()
                log.warning("guard work transaction failed (group %s): %r", self.group, exc)
                self._undo(run, Reason.DATABASE_UNAVAILABLE, repr(exc)[:300])
                return

    def _work_txn(self, conn: Connection, run: list[Item], savepoints: bool) -> None:
        now = utcnow()
        if self._mariadb:
            # no gap locks on absent stub rows: two inbox inserts of one id wait, not deadlock
            self.sql.execute(conn, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        # only without savepoints: the fast path confirms before the handler and needs a handler failure to
        # roll back the whole transaction; a savepoint would undo the handler's writes but keep the confirm
        recorded = len(run) == 1 and not savepoints and self._happy_case_first(conn, run[0], now)
        if recorded:
            # the happy case in one statement: stub confirmed or claimed, outcome written, handler pending
            stubs: dict[str, StubRow] = {}
        elif run[0].verdict is Verdict.RUN_INBOX:  # _happy_case_first lost the claim: a row exists, lock it
            run[0].verdict = None
            stubs = self.sql.lock_stubs(conn, [run[0].mid])
            self._inbox_first = False
        elif self._inbox_first:
            stubs = self._claim_then_lock(conn, run, now)
        else:
            stubs = self._lock_then_claim(conn, run, now)
        for it in run:
            v = it.verdict if recorded else judge(stubs.get(it.mid), it.claimed, self.group, it.payload_hash)
            it.verdict = v
            if v is Verdict.RUN or v is Verdict.RUN_INBOX:
                self._run_handler(conn, it, savepoint=savepoints)
            elif v is not None:
                self._decide_verdict(it, v, stubs.get(it.mid))
        ok = [it for it in run if it.decision is None and it.error is None]
        for it in ok:
            self._decide(it, Reason.PROCESSED)
        self.sql.unclaim_inbox(conn, [it.mid for it in run if it.error is not None and it.claimed])
        if recorded:
            return
        to_confirm = [it.mid for it in ok if it.verdict is Verdict.RUN]
        updates = [self._update(it) for it in run if it.decision is not None]
        changed = self.sql.confirm_and_record(conn, to_confirm, now, updates)
        if changed != len(to_confirm):
            raise ConfirmConflict(f"confirm changed {changed} of {len(to_confirm)} stubs")

    def _happy_case_first(self, conn: Connection, it: Item, now: Any) -> bool:
        """One message: confirm its stub (or claim its inbox row, PostgreSQL) and record the outcome at once.

        Sets ``it.verdict`` to RUN / RUN_INBOX when that worked. A lost inbox claim leaves RUN_INBOX with a
        False return, telling the caller a row exists and must be locked and judged.
        """
        if it.log_id is None:
            return False
        early = OutcomeUpdate(it.log_id, LogOutcome.SUCCESS, Reason.PROCESSED.value)
        if not self._inbox_first:
            if self.sql.confirm_first(conn, it.mid, self.group, it.payload_hash, now, early):
                it.verdict = Verdict.RUN
                return True
            return False
        if not self.sql.claims_with_outcome:
            return False
        it.verdict = Verdict.RUN_INBOX
        it.claimed = self.sql.claim_first(conn, self._inbox(it), now, early)
        return it.claimed

    def _lock_then_claim(self, conn: Connection, run: list[Item], now: Any) -> dict[str, StubRow]:
        """Producer stubs expected: lock them; insert inbox rows only for ids that have none."""
        if len(run) == 1:
            row = self.sql.lock_stub(conn, run[0].mid)
            stubs = {} if row is None else {run[0].mid: row}
        else:
            stubs = self.sql.lock_stubs(conn, [it.mid for it in run])
        missing = [it for it in run if it.mid not in stubs]
        if missing:
            claimed = self.sql.claim_inbox(conn, [self._inbox(it) for it in missing], now)
            for it in missing:
                it.claimed = it.mid in claimed
            lost = [it.mid for it in missing if not it.claimed]
            if lost:  # a concurrent worker inserted it while we waited: read what it committed
                stubs.update(self.sql.lock_stubs(conn, lost))
        self._inbox_first = self._adaptive and 2 * len(missing) > len(run)
        return stubs

    def _claim_then_lock(self, conn: Connection, run: list[Item], now: Any) -> dict[str, StubRow]:
        """No producer stubs lately (inbox pattern): insert first, saving the lookup that finds nothing.

        ``ON CONFLICT DO NOTHING`` takes no lock on an existing stub, so ids that turn out to have one are
        then locked with ``FOR UPDATE`` exactly as in :meth:`_lock_then_claim`.
        """
        claimed = self.sql.claim_inbox(conn, [self._inbox(it) for it in run], now)
        for it in run:
            it.claimed = it.mid in claimed
        rest = [it.mid for it in run if not it.claimed]
        stubs = self.sql.lock_stubs(conn, rest) if rest else {}
        self._inbox_first = 2 * len(claimed) >= len(run)
        return stubs

    def _undo(self, run: list[Item], reason: Reason, detail: str) -> None:
        """The work transaction rolled back as a whole: nothing in it happened, whatever was decided."""
        for it in run:
            it.error = None
            it.decision = None
            self._decide(it, reason, detail)

    def _run_handler(self, conn: Connection, it: Item, *, savepoint: bool) -> None:
        sp = conn.begin_nested() if savepoint else None
        for h in self.hooks:
            h.before_handler(it.env)
        session = self._session(conn)
        err: Exception | None = None
        try:
            self.handler(it.env, session)
            session.flush()
        except Exception as exc:  # the handler's fault, whatever it is: counted, logged, retried
            err = exc
        finally:
            session.close()
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
        it.error = err
        self.metrics.handler_failures.labels(self.group).inc()
        log.warning("handler failed message_id=%s group=%s: %r", it.mid, self.group, err, exc_info=err)
        if sp is None:
            raise HandlerFailed
        if sp.is_active:
            sp.rollback()
        # savepoint mode: the others carry on in the same transaction

    def _session(self, conn: Connection) -> Session:
        """A per-thread ``Session`` re-bound to this delivery's connection (constructing one costs more than
        the statements of a small handler). ``close()`` after each handler empties it again."""
        session: Session | None = getattr(self._local, "session", None)
        if session is None:
            session = Session(join_transaction_mode="rollback_only", expire_on_commit=False)
            self._local.session = session
        session.bind = conn
        return session

    def _inbox(self, it: Item) -> InboxRow:
        env = it.env
        return InboxRow(it.mid, env.topic, env.tags, self.group, env.body, it.payload_hash)

    def _decide_verdict(self, it: Item, v: Verdict, stub: StubRow | None) -> None:
        reason, detail, error = verdict_decision(v, it.mid, self.group, it.payload_hash, stub)
        self._decide(it, reason, detail, error=error)

    # --- bookkeeping ---------------------------------------------------------------------------------
    def _decide(
        self,
        it: Item,
        reason: Reason,
        detail: str | None = None,
        *,
        error: BaseException | None = None,
        attempts: int | None = None,
    ) -> None:
        if it.decision is None:
            it.decision = Decision(it.mid or None, reason, detail, None, attempts, error)

    def _update(self, it: Item) -> OutcomeUpdate:
        d = it.decision
        assert d is not None and it.log_id is not None
        return OutcomeUpdate(it.log_id, d.outcome, reason_text(d.reason.value, d.detail))
