"""The consumer guard: DESIGN.md §2 as an explicit state machine over the SQL and lease stores.

One delivery (or a batch of them) moves through these steps; every way out is a :class:`Reason`, and the
reason alone fixes what the broker is told (:class:`ConsumeResult`) and what the journal says
(:class:`LogOutcome`)::

    validate ──bad id──────────────────────────────────────────────────────▶ MISSING_MESSAGE_ID / BAD_MESSAGE
       │
    fast path (Redis SET NX PX … GET)
       ├─ done marker, same payload tag ──────────────────────────────────▶ DUPLICATE_DONE_MARKER
       ├─ held by another worker ── peek stub: CONFIRMED ─────────────────▶ DUPLICATE_CONFIRMED
       │                                       VOIDED ────────────────────▶ VOIDED
       │                                       otherwise ─────────────────▶ LEASE_CONFLICT
       ├─ acquired (we own processing:{owner})
       └─ unavailable / disabled / done with another payload tag (database decides alone)
       │
    journal: message_log rows + consume_progress watermark, committed ── DB down ──▶ DATABASE_UNAVAILABLE
       │
    work transaction: lock stub (FOR UPDATE) or claim an inbox row (INSERT … ON CONFLICT DO NOTHING)
       ├─ CONFIRMED ──────────────────────────────────────────────────────▶ DUPLICATE_CONFIRMED
       ├─ VOIDED ─────────────────────────────────────────────────────────▶ VOIDED
       ├─ payload hash differs ───────────────────────────────────────────▶ PAYLOAD_MISMATCH
       ├─ stub of another consumer group ─────────────────────────────────▶ BAD_MESSAGE
       └─ PENDING / DEAD / fresh inbox row: handler(env, session); conditional confirm (rowcount must match)
             ├─ commit ───────────────────────────────────── done marker ─▶ PROCESSED
             ├─ handler raised ── rollback, compare-and-delete lease ─────▶ HANDLER_FAILED / MAX_ATTEMPTS
             └─ our SQL failed / confirm matched fewer rows ─▶ DATABASE_UNAVAILABLE / CONFIRM_CONFLICT

Deviation from DESIGN.md's numbering: the Redis fast path runs *before* the journal insert, so that a
duplicate answered by Redis is journaled with its outcome in the same statement (one transaction instead of
two). The journal is still committed before any handler runs, and a lease taken before a failed journal is
released.

Batch mode runs the same steps for N envelopes with one Redis pipeline, one journal transaction and one
work transaction, optimistically without savepoints; after a handler fails, the rest run again with a
SAVEPOINT each so a failing handler rolls back only its own writes (see :meth:`Guard._work`).

A single message first tries the happy case in one statement: the conditional confirm (plus, on PostgreSQL,
the journal outcome) runs *before* the handler, holding the row lock; a handler failure rolls it back with
everything else, and only when it changes no row does the general path (lock or claim, judge) run.

The reasons, verdicts and the :class:`Decision` type live in :mod:`reliable.decision`.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from reliable import constants as C
from reliable.decision import Decision, GuardHooks, Reason, Verdict, judge, verdict_decision
from reliable.errors import BadMessageError, MissingMessageIdError
from reliable.metrics import DecisionObserver, guard_metrics
from reliable.models import utcnow
from reliable.stores import InboxRow, JournalEntry, LeaseState, OutcomeUpdate, StubRow
from reliable.stores.lease import NoLeaseStore, RedisLeaseStore, done_value, lease_key, processing_value
from reliable.stores.sql import SqlStore, reason_text
from reliable.types import ConsumeResult, Envelope, LogOutcome

log = logging.getLogger(C.GUARD_LOGGER)

__all__ = ["Decision", "Guard", "GuardHooks", "Handler", "Reason"]

Handler = Callable[[Envelope, Session], None]


@dataclass(slots=True)
class _Item:
    """Mutable per-delivery state while a batch moves through the steps."""

    env: Envelope
    mid: str
    payload_hash: str | None
    key: str = ""
    lease_value: str = ""
    owned: bool = False  # we hold processing:{owner} and must mark done or release
    verdict: Verdict | None = None
    claimed: bool = False
    twin_of: _Item | None = None  # same id earlier in this batch
    log_id: int | None = None
    decision: Decision | None = None
    error: BaseException | None = None
    written: bool = False  # the journal row carries the final outcome
    held: bool = False  # the fast path found a live lease of another worker
    worker: str = ""


class _HandlerFailed(Exception):
    """Internal: unwinds a savepoint-less work transaction after a handler raised."""


class Guard:
    """Guards ``handler`` for consumer group ``group`` on the stores of ``rel`` (a :class:`Reliability`)."""

    def __init__(
        self,
        rel: Any,
        group: str,
        handler: Handler,
        *,
        registry: CollectorRegistry | None = None,
        hooks: Sequence[GuardHooks] = (),
        redis_retry_after_s: float = C.DEFAULT_REDIS_RETRY_AFTER_S,
        durable_journal: bool = False,
    ) -> None:
        if not group or len(group) > C.GROUP_MAX:
            raise ValueError(f"consumer group must be 1..{C.GROUP_MAX} characters, got {group!r}")
        self.rel = rel
        self.group = group
        self.handler = handler
        self.settings = rel.settings
        self.engine = rel.engine
        self.sql = SqlStore(rel.engine, durable_journal=durable_journal)
        self.metrics = guard_metrics(registry)
        self.hooks = tuple(hooks)
        self.lease: RedisLeaseStore | NoLeaseStore
        if rel.redis is not None:
            self.lease = RedisLeaseStore(
                rel.redis, retry_after_s=redis_retry_after_s, on_fallback=self._redis_fallback
            )
        else:
            self.lease = NoLeaseStore()
        self._host = socket.gethostname()
        self._mariadb = self.sql.dialect in ("mysql", "mariadb")
        self._observe = DecisionObserver(self.metrics, group)
        # Learned per guard: when most recent deliveries had no producer stub, claim the inbox row first
        # (one round trip fewer). Not on MariaDB: there INSERT IGNORE share-locks an existing row and the
        # FOR UPDATE that follows could deadlock with a twin delivery.
        self._adaptive = not self._mariadb
        self._inbox_first = False
        self._local = threading.local()
        # lease values must be unique per delivery: host:pid:thread plus a per-guard token and counter
        self._token = uuid.uuid4().hex[:8]
        self._seq = itertools.count()

    # --- public -------------------------------------------------------------------------------------
    def __call__(self, env: Envelope) -> Decision:
        return self.process([env])[0]

    def process(self, envs: Sequence[Envelope]) -> list[Decision]:
        """Run every step for ``envs`` (one journal transaction, one work transaction) and decide each."""
        if not envs:
            return []
        items = self._prepare(envs)
        self._fast_path(items)
        try:
            with self.engine.connect() as conn:
                if self._journal(conn, items):
                    self._work(conn, items)
                    self._settle(conn, items)
        except SQLAlchemyError as exc:  # connect/checkout itself failed: the database is down
            self._database_down(items, "connect", exc)
        self._after_commit(items)
        return [self._finish(it) for it in items]

    # --- step 0: bad input --------------------------------------------------------------------------
    def _prepare(self, envs: Sequence[Envelope]) -> list[_Item]:
        check = self.settings.check_payload
        owner_base = f"{self._host}:{os.getpid()}:{threading.get_ident()}"
        items: list[_Item] = []
        first: dict[str, _Item] = {}
        for env in envs:
            mid = env.message_id or ""
            it = _Item(env, mid, hashlib.sha256(env.body).hexdigest() if check else None)
            it.worker = owner_base
            if not mid:
                err = MissingMessageIdError(
                    f"delivery topic={env.topic} queue={env.queue_id} offset={env.queue_offset} "
                    "has no message id"
                )
                self._decide(it, Reason.MISSING_MESSAGE_ID, str(err), error=err)
            elif len(mid) > C.MESSAGE_ID_MAX or len(env.topic) > C.TOPIC_MAX:
                err2 = BadMessageError(
                    f"message id ({len(mid)} chars) or topic ({len(env.topic)} chars) exceeds the column size"
                )
                it.mid = mid[: C.MESSAGE_ID_MAX]
                self._decide(it, Reason.BAD_MESSAGE, str(err2), error=err2)
            elif mid in first:
                it.twin_of = first[mid]
            else:
                first[mid] = it
                it.key = lease_key(self.settings.key_prefix, self.group, mid)
                it.lease_value = processing_value(f"{owner_base}:{self._token}{next(self._seq)}")
            items.append(it)
        return items

    # --- step 2: Redis fast path --------------------------------------------------------------------
    def _fast_path(self, items: list[_Item]) -> None:
        todo = [it for it in items if it.decision is None and it.twin_of is None]
        if not todo or not self.lease.enabled:
            return
        answers = self.lease.acquire_many(
            [it.key for it in todo], [it.lease_value for it in todo], self.settings.lease_ms
        )
        for it, ans in zip(todo, answers, strict=True):
            if ans.state is LeaseState.ACQUIRED:
                it.owned = True
            elif ans.state is LeaseState.DONE:
                h = it.payload_hash
                if h is None or ans.done_hash is None or h.startswith(ans.done_hash):
                    self._decide(it, Reason.DUPLICATE_DONE_MARKER)
                # else: a different body under a done id; the database check raises the mismatch
            elif ans.state is LeaseState.HELD:
                it.held = True

    # --- step 1: journal (+ the lease-conflict peek) -------------------------------------------------
    def _journal(self, conn: Connection, items: list[_Item]) -> bool:
        for h in self.hooks:
            h.before_journal([it.env for it in items])
        now = utcnow()
        try:
            if self.sql.journal_autocommits:
                # one statement, committed by itself: saves the BEGIN and COMMIT round trips
                self.sql.autocommit(conn, True)
                try:
                    ids = self._journal_statements(conn, items, now)
                finally:
                    if not conn.invalidated:
                        self.sql.autocommit(conn, False)
            else:
                with conn.begin():
                    ids = self._journal_statements(conn, items, now)
        except SQLAlchemyError as exc:
            self._database_down(items, "journal", exc)
            return False
        for it, log_id in zip(items, ids, strict=True):
            it.log_id = log_id
            it.written = it.decision is not None
        for h in self.hooks:
            h.after_journal([it.env for it in items], ids)
        return True

    def _journal_statements(self, conn: Connection, items: list[_Item], now: Any) -> list[int]:
        held = [it for it in items if it.held]
        if held:
            stubs = self.sql.peek_stubs(conn, [it.mid for it in held])
            for it in held:
                self._decide_held(it, stubs.get(it.mid))
        self._resolve_twins(items)  # twins of an already decided delivery share its fate
        return self.sql.journal(conn, [self._entry(it, now) for it in items])

    def _decide_held(self, it: _Item, stub: StubRow | None) -> None:
        v = judge(stub, False, self.group, it.payload_hash)
        if v is Verdict.DUPLICATE:
            self._decide(it, Reason.DUPLICATE_CONFIRMED)
        elif v is Verdict.VOIDED:
            self._decide(it, Reason.VOIDED)
        elif v in (Verdict.MISMATCH, Verdict.FOREIGN_GROUP):
            self._decide_verdict(it, v, stub)
        else:
            self._decide(it, Reason.LEASE_CONFLICT, "another worker holds a live lease")

    def _entry(self, it: _Item, now: Any) -> JournalEntry:
        d = it.decision
        env = it.env
        return JournalEntry(
            message_id=it.mid,
            consumer_group=self.group,
            topic=env.topic[: C.TOPIC_MAX],
            queue_id=env.queue_id,
            queue_offset=env.queue_offset,
            reconsume_times=env.reconsume_times,
            received_at=now,
            worker=it.worker[:128],
            outcome=None if d is None else d.outcome,
            reason=None if d is None else reason_text(d.reason.value, d.detail),
        )

    # --- step 3: the work transaction ---------------------------------------------------------------
    def _work(self, conn: Connection, items: list[_Item]) -> None:
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
            except _HandlerFailed:  # rolled back as a whole; _settle decides the failed one
                run = [it for it in run if it.error is None]
                savepoints = True
            except _ConfirmConflict as exc:
                self._undo(run, Reason.CONFIRM_CONFLICT, str(exc))
                return
            except SQLAlchemyError as exc:
                self.metrics.database_errors.labels(self.group, "work").inc()
                log.warning("guard work transaction failed (group %s): %r", self.group, exc)
                self._undo(run, Reason.DATABASE_UNAVAILABLE, repr(exc)[:300])
                return

    def _work_txn(self, conn: Connection, run: list[_Item], savepoints: bool) -> None:
        now = utcnow()
        if self._mariadb:
            # no gap locks on absent stub rows: two inbox inserts of one id wait, not deadlock
            self.sql.execute(conn, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        recorded = False
        if len(run) == 1 and not self._inbox_first:
            it = run[0]
            early = OutcomeUpdate(it.log_id or 0, LogOutcome.SUCCESS, Reason.PROCESSED.value)
            recorded = it.log_id is not None and self.sql.confirm_first(
                conn, it.mid, self.group, it.payload_hash, now, early
            )
        if recorded:
            # the happy case in one statement: stub confirmed and outcome written, pending the handler
            stubs: dict[str, StubRow] = {}
            run[0].verdict = Verdict.RUN
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
            raise _ConfirmConflict(f"confirm changed {changed} of {len(to_confirm)} stubs")

    def _lock_then_claim(self, conn: Connection, run: list[_Item], now: Any) -> dict[str, StubRow]:
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

    def _claim_then_lock(self, conn: Connection, run: list[_Item], now: Any) -> dict[str, StubRow]:
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

    def _undo(self, run: list[_Item], reason: Reason, detail: str) -> None:
        """The work transaction rolled back as a whole: nothing in it happened, whatever was decided."""
        for it in run:
            it.error = None
            it.decision = None
            self._decide(it, reason, detail)

    def _run_handler(self, conn: Connection, it: _Item, *, savepoint: bool) -> None:
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
            raise _HandlerFailed
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

    def _inbox(self, it: _Item) -> InboxRow:
        env = it.env
        return InboxRow(it.mid, env.topic, env.tags, self.group, env.body, it.payload_hash)

    def _decide_verdict(self, it: _Item, v: Verdict, stub: StubRow | None) -> None:
        reason, detail, error = verdict_decision(v, it.mid, self.group, it.payload_hash, stub)
        self._decide(it, reason, detail, error=error)

    # --- step 5: failures, twins and late outcomes --------------------------------------------------
    def _settle(self, conn: Connection, items: list[_Item]) -> None:
        """Decide failed handlers (retry or dead letter) and batch twins; journal every late outcome."""
        late = [it for it in items if not it.written and it.log_id is not None]
        if not late:
            return
        try:
            with conn.begin():
                for it in late:
                    if it.error is not None and it.decision is None:
                        prior = self.sql.count_handler_failures(conn, it.mid, self.group)
                        attempts = max(it.env.reconsume_times, prior) + 1
                        detail = f"attempt {attempts}/{self.settings.max_attempts}: {it.error!r}"
                        if attempts >= self.settings.max_attempts:
                            self._decide(it, Reason.MAX_ATTEMPTS, detail, error=it.error, attempts=attempts)
                        else:
                            self._decide(it, Reason.HANDLER_FAILED, detail, error=it.error, attempts=attempts)
                self._resolve_twins(items)
                self.sql.set_outcomes(conn, [self._update(it) for it in late if it.decision is not None])
        except SQLAlchemyError as exc:
            self.metrics.database_errors.labels(self.group, "outcome").inc()
            log.warning("could not journal outcomes (group %s): %r", self.group, exc)
        for it in late:
            if it.decision is None:  # journaling failed before we could decide: retry is always safe
                self._decide(it, Reason.DATABASE_UNAVAILABLE, "could not record the outcome")

    def _resolve_twins(self, items: list[_Item]) -> None:
        for it in items:
            first = it.twin_of
            if first is None or it.decision is not None or first.decision is None:
                continue
            if first.decision.result is ConsumeResult.SUCCESS:
                self._decide(it, Reason.DUPLICATE_IN_BATCH)
            else:
                self._decide(it, Reason.LEASE_CONFLICT, "same message id earlier in this batch not done")

    # --- step 4: Redis after the commit -------------------------------------------------------------
    def _after_commit(self, items: list[_Item]) -> None:
        if not self.lease.enabled:
            return
        done: list[tuple[str, str]] = []
        for it in items:
            if not it.owned:
                continue
            d = it.decision
            if d is not None and d.reason in (Reason.PROCESSED, Reason.DUPLICATE_CONFIRMED):
                done.append((it.key, done_value(it.payload_hash)))
            else:  # compare-and-delete: a redelivery may take the message at once
                self.lease.release(it.key, it.lease_value)
        self.lease.mark_done_many(done, self.settings.done_ttl_s)

    # --- bookkeeping --------------------------------------------------------------------------------
    def _decide(
        self,
        it: _Item,
        reason: Reason,
        detail: str | None = None,
        *,
        error: BaseException | None = None,
        attempts: int | None = None,
    ) -> None:
        if it.decision is None:
            it.decision = Decision(it.mid or None, reason, detail, None, attempts, error)

    def _database_down(self, items: list[_Item], step: str, exc: BaseException) -> None:
        self.metrics.database_errors.labels(self.group, step).inc()
        log.warning("database unavailable during %s (group %s): %r", step, self.group, exc)
        for it in items:
            it.decision = None
            it.error = None
            self._decide(it, Reason.DATABASE_UNAVAILABLE, f"{step}: {exc!r}"[:300])

    def _update(self, it: _Item) -> OutcomeUpdate:
        d = it.decision
        assert d is not None and it.log_id is not None
        return OutcomeUpdate(it.log_id, d.outcome, reason_text(d.reason.value, d.detail))

    def _redis_fallback(self, operation: str, exc: BaseException) -> None:
        self.metrics.redis_fallbacks.labels(operation).inc()

    def _finish(self, it: _Item) -> Decision:
        d = it.decision
        if d is None:  # defensive: every path decides; if one did not, redelivery is the safe answer
            d = Decision(it.mid or None, Reason.DATABASE_UNAVAILABLE, "undecided")
        d = Decision(d.message_id, d.reason, d.detail, it.log_id, d.attempts, d.error)
        self._observe(d)
        for h in self.hooks:
            h.after_decision(it.env, d)
        return d


class _ConfirmConflict(Exception):
    """Internal: the conditional confirm changed fewer rows than expected; the transaction rolls back."""
