"""The consumer guard: DESIGN.md §2 per ``(group, message_id)``, read top to bottom in call order.

One delivery (or a batch) moves through these steps; every way out is a :class:`Reason`, and the reason alone
fixes what the broker is told and what the journal says (:data:`reliable.guard.decision.OUTCOMES`)::

    validate ──bad id──────────────────────────────────────────────────────▶ MISSING_MESSAGE_ID / BAD_MESSAGE
       │
    fast path (Redis SET NX PX … GET)
       ├─ done marker, same payload tag ──────────────────────────────────▶ DUPLICATE_DONE_MARKER
       ├─ held by another worker ── peek the group's inbox row: CONFIRMED ▶ DUPLICATE_CONFIRMED
       │                                                      VOIDED ─────▶ VOIDED
       │                                                      otherwise ──▶ LEASE_CONFLICT
       ├─ acquired (we own processing:{owner})
       └─ unavailable / disabled / done with another payload tag (database decides alone)
       │
    journal: message_log row (delivered position) + that queue's watermark ── DB down ─▶ DATABASE_UNAVAILABLE
       │
    work transaction (WorkTransaction): lock the group's inbox row, or insert it CONFIRMED if there is none
       ├─ CONFIRMED ──────────────────────────────────────────────────────▶ DUPLICATE_CONFIRMED
       ├─ VOIDED ─────────────────────────────────────────────────────────▶ VOIDED
       ├─ payload hash differs ───────────────────────────────────────────▶ PAYLOAD_MISMATCH
       └─ PENDING / DEAD / fresh inbox row: handler(env, session); conditional confirm (rowcount must match)
             ├─ commit ───────────────────────────────────── done marker ─▶ PROCESSED
             ├─ handler raised ── rollback, attempts + 1 on the inbox row ▶ HANDLER_FAILED / MAX_ATTEMPTS
             └─ our SQL failed / confirm matched fewer rows ─▶ DATABASE_UNAVAILABLE / CONFIRM_CONFLICT
    twins (same id twice in one batch) share the first's fate; a different body ─▶ PAYLOAD_MISMATCH

``attempts`` counts this group's handler failures only (lease conflicts and database outages never touch it);
:func:`reliable.outbox.revive` and a targeted resend reset it.

Deviation from DESIGN.md's numbering: the Redis fast path runs *before* the journal insert, so that a
duplicate answered by Redis is journaled with its outcome in the same statement. The journal is still
committed before any handler runs, and a lease taken before a failed journal is released. With
``journal_write_behind`` (default on here) the rows of deliveries answered by the done marker wait in
:class:`reliable.stores.behind.JournalBuffer` (what a crash can lose is documented there).

Shape: the guard *owns* its collaborators — :class:`SqlStore` (source of truth), a lease store (fast path),
:class:`WorkTransaction` (step 3), optionally a :class:`JournalBuffer` — and every decision is a pure
function of :mod:`reliable.guard.plan` / :mod:`reliable.guard.decision`, so an asyncio guard reuses them all.
"""

from __future__ import annotations

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
from sqlalchemy.exc import SQLAlchemyError

from reliable import constants as C
from reliable.guard import plan
from reliable.guard.decision import TEXTS, Decision, GuardHooks, Reason, failure_reason
from reliable.guard.plan import Item
from reliable.guard.work import Handler, WorkTransaction
from reliable.metrics import DecisionObserver, guard_metrics
from reliable.models import utcnow
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
        if not group or len(group) > C.GROUP_MAX:
            raise ValueError(f"consumer group must be 1..{C.GROUP_MAX} characters, got {group!r}")
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
        self.work = WorkTransaction(self.sql, group, handler, self.hooks, self.metrics)
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
        """Run every step for ``envs`` (one journal transaction, one work transaction) and decide each."""
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
            try:
                with self.engine.connect() as conn:
                    if self._journal(conn, now_due):
                        self.work.run(conn, now_due)
                        self._settle(conn, now_due)
            except SQLAlchemyError as exc:  # connect/checkout itself failed: the database is down
                self._database_down(now_due, "connect", exc)
        self._after_commit(items)
        return [self._finish(it) for it in items]

    def flush_journal(self) -> int:
        """Write the buffered duplicate rows now (write-behind journal); returns how many were written."""
        return 0 if self.behind is None else self.behind.flush()

    def close(self) -> None:
        """Flush and stop the write-behind journal, if any (also runs at interpreter exit)."""
        if self.behind is not None:
            self.behind.close()

    # --- step 2: Redis fast path --------------------------------------------------------------------
    def _fast_path(self, items: list[Item]) -> None:
        todo = plan.lease_candidates(items)
        if todo and self.lease.enabled:
            keys, values = [it.key for it in todo], [it.lease_value for it in todo]
            plan.apply_leases(todo, self.lease.acquire_many(keys, values, self.settings.lease_ms))

    def _defer_done_duplicates(self, items: list[Item]) -> list[Item]:
        """Hand the rows of deliveries Redis answered ``done`` to the write-behind journal (if enabled)."""
        if self.behind is None:
            return items
        deferred, rest = plan.split_done_duplicates(items)
        if deferred:
            now = utcnow()
            self.behind.add([plan.journal_entry(it, self.group, now) for it in deferred])
        return rest

    # --- step 1: journal (+ the lease-conflict peek) -------------------------------------------------
    def _journal(self, conn: Connection, items: list[Item]) -> bool:
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

    def _journal_statements(self, conn: Connection, items: list[Item], now: Any) -> list[int]:
        held = [it for it in items if it.held]
        if held:
            states = self.sql.peek_inbox(conn, self.group, [it.mid for it in held])
            for it in held:
                plan.decide_held(it, states.get(it.mid))
        plan.resolve_twins(items)  # twins of an already decided delivery share its fate
        return self.sql.journal(conn, [plan.journal_entry(it, self.group, now) for it in items])

    # --- step 5: failures, twins and late outcomes --------------------------------------------------
    def _settle(self, conn: Connection, items: list[Item]) -> None:
        """Count handler failures, decide them (retry or dead letter) and the twins; journal late outcomes."""
        late = [it for it in items if not it.written and it.log_id is not None]
        if not late:
            return
        try:
            with conn.begin():
                now = utcnow()
                for it in late:
                    if it.error is not None and it.decision is None:
                        attempts = self.sql.record_failure(
                            conn, self.group, it.inbox_row, now, repr(it.error)
                        )
                        reason = failure_reason(attempts, self.settings.max_attempts)
                        detail = f"attempt {attempts}/{self.settings.max_attempts}: {it.error!r}"
                        plan.decide(it, reason, detail, error=it.error, attempts=attempts)
                plan.resolve_twins(items)
                self.sql.set_outcomes(
                    conn, [plan.outcome_update(it) for it in late if it.decision is not None]
                )
        except SQLAlchemyError as exc:
            self.metrics.database_errors.labels(self.group, "outcome").inc()
            log.warning("could not journal outcomes (group %s): %r", self.group, exc)
        for it in late:
            if it.decision is None:  # journaling failed before we could decide: retry is always safe
                plan.decide(it, Reason.DATABASE_UNAVAILABLE, TEXTS["no_outcome"])

    # --- step 4: Redis after the commit -------------------------------------------------------------
    def _after_commit(self, items: list[Item]) -> None:
        if not self.lease.enabled:
            return
        done, release = plan.after_commit_plan(items)
        for key, value in release:  # compare-and-delete: only if still ours
            self.lease.release(key, value)
        self.lease.mark_done_many(done, self.settings.done_ttl_s)

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
