"""The consumer guard: DESIGN.md §2 per ``(group, message_id)``, read top to bottom in call order.

One delivery (or a batch) moves through these steps; every way out is a :class:`Reason`, and the reason alone
fixes what the broker is told and what the journal says (:data:`reliable.guard.decision.OUTCOMES`)::

    validate ──bad id──────────────────────────────────────────────────────▶ MISSING_MESSAGE_ID / BAD_MESSAGE
       │
    fast path (Redis SET NX PX … GET)
       ├─ done marker, same payload tag ──────────────────────────────────▶ DUPLICATE_DONE_MARKER
       ├─ held by another worker ── peek the group's inbox row: CONFIRMED ▶ DUPLICATE_CONFIRMED
       │                                                      VOIDED ─────▶ VOIDED
       │                                                      otherwise ──▶ LEASE_CONFLICT (+ the lease's
       │                                                        PTTL: Decision.retry_after_ms)
       ├─ acquired (we own processing:{owner})
       └─ unavailable / disabled / done with another payload tag (database decides alone)
       │
    work transaction (WorkTransaction), one commit: the journal row (delivered position) first, then lock
    the group's inbox row, or insert it CONFIRMED if there is none ─── DB down ─▶ DATABASE_UNAVAILABLE
       (a pooled connection its first statement finds dead is replaced and the transaction run once more)
       ├─ CONFIRMED ──────────────────────────────────────────────────────▶ DUPLICATE_CONFIRMED
       ├─ VOIDED ─────────────────────────────────────────────────────────▶ VOIDED
       ├─ payload hash differs ───────────────────────────────────────────▶ PAYLOAD_MISMATCH
       └─ PENDING / DEAD / fresh inbox row: handler(env, session); conditional confirm (rowcount must match)
             ├─ watermark + commit ─────────────────── done marker (unwaited) ▶ PROCESSED
             ├─ handler raised ── rollback ─┐
             └─ our SQL failed / confirm matched fewer rows ─▶ DATABASE_UNAVAILABLE / CONFIRM_CONFLICT
    settle (one transaction) ◀──────────────┘ journal row again + attempts + 1 ▶ HANDLER_FAILED / MAX_ATTEMPTS
       also journals what was decided without running: held, bad input, twins (same id twice in one batch
       share the first's fate; a different body ─▶ PAYLOAD_MISMATCH), rolled-back runs

``attempts`` counts this group's handler failures only (lease conflicts and database outages never touch it);
:func:`reliable.outbox.revive` and a targeted resend reset it. At ``max_attempts`` the settle step also sets
the group's ``PENDING`` inbox row ``DEAD`` (:func:`reliable.outbox.mark_dead`, reason in ``last_error``): a
re-send cannot help a handler that keeps failing, so a person must decide (revive once fixed, or void), and
the sweeper tells one (:func:`reliable.sweeper.giveup.tell_unreported`).

Deviation from DESIGN.md's numbering (issue 18): the journal row is not committed on its own before the
handler; it is the first statement of the work transaction, and the watermark its last, so a new message costs
one commit. Nothing is lost by that: a delivery whose handler fails is journaled again by the settle step
together with its attempt count; a worker that dies mid-handler leaves nothing, exactly like a worker that
died before journaling, and the broker redelivers (docs/decorator.md, "One commit per new message"). The
Redis fast path runs first, so a duplicate answered by Redis never opens a transaction. With
``journal_write_behind`` (default on here) the rows of deliveries answered by the done marker wait in
:class:`reliable.stores.behind.JournalBuffer` (what a crash can lose is documented there).

Shape: the guard *owns* its collaborators — :class:`SqlStore` (source of truth), a lease store (fast path),
:class:`WorkTransaction` (step 3), optionally a :class:`JournalBuffer` — and every decision is a pure
function of :mod:`reliable.guard.plan` / :mod:`reliable.guard.decision`, so an asyncio guard reuses them all.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from reliable import constants as C
from reliable import outbox
from reliable.guard import plan
from reliable.guard.db_errors import is_deadlock
from reliable.guard.decision import (
    TEXTS,
    Decision,
    GuardHooks,
    HandlerCancelled,
    Reason,
    dead_letter_error,
    failure_reason,
)
from reliable.guard.plan import Item
from reliable.guard.work import Handler, StaleConnection, WorkTransaction
from reliable.metrics import DecisionObserver, guard_metrics
from reliable.models import utcnow
from reliable.names import check_group
from reliable.stores.behind import JournalBuffer
from reliable.stores.lease import NoLeaseStore, RedisLeaseStore
from reliable.stores.sql import SqlStore

log = logging.getLogger(C.GUARD_LOGGER)


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
        check_group(group)
        self.rel = rel
        self.group = group
        self.handler = handler
        self.settings = rel.settings
        self.engine = rel.engine
        self.hooks = tuple(hooks)
        self.metrics = guard_metrics(registry)
        self.sql = SqlStore(rel.engine, durable_journal=durable_journal)
        self.lease: RedisLeaseStore | NoLeaseStore = (
            RedisLeaseStore(rel.redis, retry_after_s=redis_retry_after_s, on_fallback=self._redis_fallback)
            if rel.redis is not None
            else NoLeaseStore()
        )
        self.work = WorkTransaction(
            self.sql, group, handler, self.hooks, self.metrics, self.settings.max_attempts
        )
        self.behind: JournalBuffer | None = None
        if self.settings.journal_write_behind is not False:  # None (default) or True
            self.behind = JournalBuffer(
                rel.engine,
                self.sql,
                max_rows=self.settings.journal_flush_rows,
                max_ms=self.settings.journal_flush_ms,
                on_error=lambda n, exc: self.metrics.database_errors.labels(group, "journal_behind").inc(),
            )
        self._observe = DecisionObserver(self.metrics, group)
        # lease values must be unique per delivery: host:pid:thread plus a per-guard token and counter
        self._host = socket.gethostname()
        self._token = uuid.uuid4().hex[:8]
        self._seq = itertools.count()

    # --- public -------------------------------------------------------------------------------------
    def __call__(self, env: Any) -> Decision:
        return self.process([env])[0]

    def process(self, envs: Sequence[Any]) -> list[Decision]:
        """Run every step for ``envs`` and decide each: one work transaction (it journals what it runs), and a
        settle transaction only for what it did not commit (failures, deliveries decided without running)."""
        if not envs:
            return []
        worker = f"{self._host}:{os.getpid()}:{threading.get_ident()}"
        items = plan.prepare(
            envs,
            group=self.group,
            key_prefix=self.settings.key_prefix,
            check_payload=self.settings.check_payload,
            owner=lambda: f"{worker}:{self._token}{next(self._seq)}",
        )
        for it in items:
            it.worker = worker
        self._fast_path(items)
        now_due = self._defer_done_duplicates(items)
        if now_due:
            for h in self.hooks:
                h.before_journal([it.env for it in now_due])
            self._database_steps(now_due)
        self._lease_waits(items)
        self._after_commit(items)
        self._staged_sends(items)
        return [self._finish(it) for it in items]

    def flush_journal(self) -> int:
        """Write the buffered duplicate rows now (write-behind journal); returns how many were written."""
        return 0 if self.behind is None else self.behind.flush()

    def close(self) -> None:
        """Flush and stop the write-behind journal, if any, and the unwaited done markers (also at exit)."""
        if self.behind is not None:
            self.behind.close()
        self.lease.close()

    # --- steps 2b, 3 and 5 on one pooled connection ---------------------------------------------------
    def _database_steps(self, items: list[Item]) -> None:
        """Peek held rows, run the work transaction, settle the rest; once more on a fresh connection if the
        first statement found the pooled one dead (nothing had run: :class:`StaleConnection`)."""
        for attempt in (1, 2):
            try:
                with self.engine.connect() as conn:
                    if not self._peek_held(conn, items):
                        return
                    try:
                        self.work.run(conn, items)
                    except StaleConnection as exc:
                        if attempt == 2:
                            self._database_down(items, "work", exc)
                            return
                        log.info("guard connection found dead (group %s), retrying on a new one", self.group)
                        continue
                    self._settle(conn, items)
                    return
            except SQLAlchemyError as exc:  # connect/checkout itself failed: the database is down
                self._database_down(items, "connect", exc)
                return

    # --- step 2: Redis fast path --------------------------------------------------------------------
    def _fast_path(self, items: list[Item]) -> None:
        todo = plan.lease_candidates(items)
        if todo and self.lease.enabled:
            keys, values = [it.key for it in todo], [it.lease_value for it in todo]
            plan.apply_leases(todo, self.lease.acquire_many(keys, values, self.settings.lease_ms))

    def _lease_waits(self, items: list[Item]) -> None:
        """Ask Redis how long the other worker's lease of each lease conflict has left (``PTTL``, one
        pipeline; only on this path, never for a delivery that ran), so the adapter can wait that long."""
        conflicts = plan.lease_conflicts(items)
        if conflicts:
            pttls = self.lease.remaining_ms([it.key for it in conflicts])
            plan.apply_lease_waits(conflicts, pttls, self.settings.lease_ms)

    def _defer_done_duplicates(self, items: list[Item]) -> list[Item]:
        """Hand the rows of deliveries Redis answered ``done`` to the write-behind journal (if enabled)."""
        if self.behind is None:
            return items
        deferred, rest = plan.split_done_duplicates(items)
        if deferred:
            now = utcnow()
            self.behind.add([plan.journal_entry(it, self.group, now) for it in deferred])
        return rest

    # --- step 2b: what does the database say about a message another worker holds? ----------------------
    def _peek_held(self, conn: Connection, items: list[Item]) -> bool:
        """Read the inbox rows of held deliveries (no lock, autocommitted); False: the database is down."""
        held = [it for it in items if it.held]
        if not held:
            return True
        fatal_here = functools.partial(self.sql.log.dead_lettered_at, conn)
        try:
            with self.sql.transaction(conn):
                states = self.sql.peek_inbox(conn, self.group, [it.mid for it in held])
                for it in held:  # a copy for another group of a dead row asks the journal here (rare)
                    plan.decide_held(
                        it, states.get(it.mid), self.settings.max_attempts, self.group, fatal_here
                    )
        except SQLAlchemyError as exc:
            self._database_down(items, "journal", exc)
            return False
        return True

    # --- step 5: journal what the work transaction did not commit ----------------------------------------
    def _settle(self, conn: Connection, items: list[Item]) -> None:
        """Journal, with its final outcome, every delivery the work transaction did not commit — decided
        before it (held, bad input, done duplicates without write-behind), twins, failed handlers, rolled-back
        runs — and count each handler failure (retry or dead letter): one transaction, one commit.

        This is where a failed handler's journal row survives: the work transaction that carried it rolled
        back, so it is written again here, beside ``attempts + 1``. If this transaction fails too, every such
        delivery is answered with a retry (always safe: nothing of it was committed).
        """
        late = [it for it in items if not it.written]
        if not late:
            return
        now = utcnow()
        # in id order, as every other step takes inbox row locks: two batches settling failures deadlocked
        failed = sorted((it for it in late if it.error is not None and it.decision is None), key=_mid)
        before = [(it, it.decision, it.log_id) for it in late]
        for tries in range(C.GUARD_DEADLOCK_RETRIES + 1):
            try:
                fresh = self._settle_once(conn, items, late, failed, now)
                break
            except DBAPIError as exc:
                # not retried on a lost connection: its last statement carries the COMMIT, and one lost there
                # may have committed (a second run would count each failure twice); a connection that was
                # dead before the first statement is kept from the settle step by the pool's checkout check
                # (reliable.pool_liveness: every checkout is pinged for a while after one connection died)
                if not (is_deadlock(exc) and tries < C.GUARD_DEADLOCK_RETRIES):
                    self._settle_failed(late, exc)
                    return
                for it, decision, log_id in before:  # rolled back in full: decide again from the start
                    it.decision, it.log_id = decision, log_id
                self.metrics.database_errors.labels(self.group, "deadlock_retried").inc()
            except SQLAlchemyError as exc:
                self._settle_failed(late, exc)
                return
        for it in late:
            it.written = True
        if fresh:
            for h in self.hooks:
                h.after_journal([it.env for it in fresh], [it.log_id or 0 for it in fresh])

    def _settle_once(
        self, conn: Connection, items: list[Item], late: list[Item], failed: list[Item], now: dt.datetime
    ) -> list[Item]:
        """One try of :meth:`_settle`'s transaction; returns the deliveries it journaled afresh."""
        with self.sql.transaction(conn):
            self.sql.no_gap_locks(conn)  # as the work transaction
            for i, it in enumerate(failed):
                error = repr(it.error)
                attempts = self.sql.record_failure(conn, self.group, it.inbox_row, now, error, begin=i == 0)
                if attempts is None:  # applied by another worker while this handler ran and failed
                    plan.decide(it, Reason.DUPLICATE_CONFIRMED, TEXTS["confirmed_meanwhile"])
                    continue
                # a cancelled handler did not fail: a stop on the broker's last delivery leaves the row
                # PENDING (the sweeper re-sends it once stuck), it does not dead-letter a healthy message
                last = it.env.last_attempt and not isinstance(it.error, HandlerCancelled)
                reason = failure_reason(attempts, self.settings.max_attempts, last)
                broker = ", the broker's last delivery" if last else ""
                detail = f"attempt {attempts}/{self.settings.max_attempts}{broker}: {it.error!r}"
                plan.decide(it, reason, detail, error=it.error, attempts=attempts)
                if reason is Reason.MAX_ATTEMPTS:  # a person decides now: DEAD, told by the sweeper
                    error_text = dead_letter_error(it.env, detail)
                    spent = self.settings.max_attempts
                    outbox.mark_dead(conn, it.mid, self.group, now, error_text, spent=spent)
            plan.resolve_twins(items)
            for it in late:
                if it.decision is None:  # a bug: answer it with a safe retry, journaled as such
                    plan.decide(it, Reason.DATABASE_UNAVAILABLE, TEXTS["undecided"])
            known = [it for it in late if it.log_id is not None]  # failed in savepoint mode: row exists
            fresh = [it for it in late if it.log_id is None]
            self.sql.log.set_outcomes(conn, [plan.outcome_update(it) for it in known])
            entries = [plan.journal_entry(it, self.group, now) for it in fresh]
            ids = self.sql.log.journal_alone(conn, entries, opened=bool(failed or known))
            for it, log_id in zip(fresh, ids, strict=True):
                it.log_id = log_id
        return fresh

    def _settle_failed(self, late: list[Item], exc: SQLAlchemyError) -> None:
        self._database_down(late, "journal", exc)
        for it in late:
            it.log_id = None

    # --- step 4: Redis after the commit -------------------------------------------------------------
    def _after_commit(self, items: list[Item]) -> None:
        if not self.lease.enabled:
            return
        done, release = plan.after_commit_plan(items)
        for key, value in release:  # compare-and-delete: only if still ours
            self.lease.release(key, value)
        self.lease.mark_done_many(done, self.settings.done_ttl_s)

    def _staged_sends(self, items: list[Item]) -> None:
        """Send what the handlers staged through their session (``StubProducer.stage``), now that their
        transaction has committed and its connection is back in the pool. A handler's session never commits
        itself — the guard commits its connection — so the producer's after-commit hook never fired, and
        the message waited for the sweeper's first resend (until 2026-11-28)."""
        for it in items:
            if it.after_commit and it.decision is not None and it.decision.reason is Reason.PROCESSED:
                for send in it.after_commit:
                    try:
                        send()
                    except Exception:  # the commit stands; the sweeper sends what this did not
                        log.exception("send of a message staged by the handler of %s failed", it.mid)
            it.after_commit = []

    # --- bookkeeping --------------------------------------------------------------------------------
    def _database_down(self, items: list[Item], step: str, exc: BaseException) -> None:
        self.metrics.database_errors.labels(self.group, step).inc()
        log.warning("database unavailable during %s (group %s): %r", step, self.group, exc)
        plan.database_down(items, step, exc)

    def _redis_fallback(self, operation: str, exc: BaseException) -> None:
        self.metrics.redis_fallbacks.labels(operation).inc()

    def _finish(self, it: Item) -> Decision:
        d = plan.final_decision(it, self.group)
        self._observe(d)
        for h in self.hooks:
            h.after_decision(it.env, d)
        return d


def _mid(it: Item) -> str:
    return it.mid
