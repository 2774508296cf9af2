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

With ``journal_write_behind`` the journal rows of deliveries answered by the done marker skip the database
trip entirely and wait in :class:`reliable.stores.behind.JournalBuffer` (what a crash can lose is documented
there); every other delivery is journaled as above.

Batch mode runs the same steps for N envelopes with one Redis pipeline, one journal transaction and one
work transaction, optimistically without savepoints; after a handler fails, the rest run again with a
SAVEPOINT each so a failing handler rolls back only its own writes (see :meth:`Guard._work`).

A single message first tries the happy case in one statement: the conditional confirm (plus, on PostgreSQL,
the journal outcome) runs *before* the handler, holding the row lock; a handler failure rolls it back with
everything else, and only when it changes no row does the general path (lock or claim, judge) run.

The reasons, verdicts and the :class:`Decision` type live in :mod:`reliable.decision`; the work transaction
(step 3) and the per-delivery state in :mod:`reliable.guard_work`.
"""

from __future__ import annotations

import hashlib
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
from reliable.decision import Decision, GuardHooks, Reason, Verdict, judge
from reliable.errors import BadMessageError, MissingMessageIdError
from reliable.guard_work import Handler, Item, WorkStep
from reliable.metrics import DecisionObserver, guard_metrics
from reliable.models import utcnow
from reliable.stores import JournalEntry, LeaseState, StubRow
from reliable.stores.behind import JournalBuffer
from reliable.stores.lease import NoLeaseStore, RedisLeaseStore, done_value, lease_key, processing_value
from reliable.stores.sql import SqlStore, reason_text
from reliable.types import ConsumeResult, Envelope

log = logging.getLogger(C.GUARD_LOGGER)

__all__ = ["Decision", "Guard", "GuardHooks", "Handler", "Reason"]


class Guard(WorkStep):
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
        self._behind: JournalBuffer | None = None
        if self.settings.journal_write_behind:
            self._behind = JournalBuffer(
                rel.engine,
                self.sql,
                max_rows=self.settings.journal_flush_rows,
                max_ms=self.settings.journal_flush_ms,
                on_error=lambda n, exc: self.metrics.database_errors.labels(group, "journal_behind").inc(),
            )

    # --- public -------------------------------------------------------------------------------------
    def __call__(self, env: Envelope) -> Decision:
        return self.process([env])[0]

    def process(self, envs: Sequence[Envelope]) -> list[Decision]:
        """Run every step for ``envs`` (one journal transaction, one work transaction) and decide each."""
        if not envs:
            return []
        items = self._prepare(envs)
        self._fast_path(items)
        now_due = items if self._behind is None else self._defer_done_duplicates(items, self._behind)
        if now_due:
            try:
                with self.engine.connect() as conn:
                    if self._journal(conn, now_due):
                        self._work(conn, now_due)
                        self._settle(conn, now_due)
            except SQLAlchemyError as exc:  # connect/checkout itself failed: the database is down
                self._database_down(now_due, "connect", exc)
        self._after_commit(items)
        return [self._finish(it) for it in items]

    def flush_journal(self) -> int:
        """Write the buffered duplicate rows now (write-behind journal); returns how many were written."""
        return 0 if self._behind is None else self._behind.flush()

    def close(self) -> None:
        """Flush and stop the write-behind journal, if any (also runs at interpreter exit)."""
        if self._behind is not None:
            self._behind.close()

    def _defer_done_duplicates(self, items: list[Item], behind: JournalBuffer) -> list[Item]:
        """Hand the rows of deliveries Redis answered as ``done`` to the write-behind journal.

        Only those: their first delivery's row is committed already, so theirs is evidence of a duplicate,
        not of arrival (see :mod:`reliable.stores.behind`). Everything else is journaled synchronously.
        """
        deferred: list[JournalEntry] = []
        rest: list[Item] = []
        now = utcnow()
        for it in items:
            d = it.decision
            if d is not None and d.reason is Reason.DUPLICATE_DONE_MARKER:
                deferred.append(self._entry(it, now))
            else:
                rest.append(it)
        if deferred:
            behind.add(deferred)
        return rest

    # --- step 0: bad input --------------------------------------------------------------------------
    def _prepare(self, envs: Sequence[Envelope]) -> list[Item]:
        check = self.settings.check_payload
        owner_base = f"{self._host}:{os.getpid()}:{threading.get_ident()}"
        items: list[Item] = []
        first: dict[str, Item] = {}
        for env in envs:
            mid = env.message_id or ""
            it = Item(env, mid, hashlib.sha256(env.body).hexdigest() if check else None)
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
    def _fast_path(self, items: list[Item]) -> None:
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
            stubs = self.sql.peek_stubs(conn, [it.mid for it in held])
            for it in held:
                self._decide_held(it, stubs.get(it.mid))
        self._resolve_twins(items)  # twins of an already decided delivery share its fate
        return self.sql.journal(conn, [self._entry(it, now) for it in items])

    def _decide_held(self, it: Item, stub: StubRow | None) -> None:
        v = judge(stub, False, self.group, it.payload_hash)
        if v is Verdict.DUPLICATE:
            self._decide(it, Reason.DUPLICATE_CONFIRMED)
        elif v is Verdict.VOIDED:
            self._decide(it, Reason.VOIDED)
        elif v in (Verdict.MISMATCH, Verdict.FOREIGN_GROUP):
            self._decide_verdict(it, v, stub)
        else:
            self._decide(it, Reason.LEASE_CONFLICT, "another worker holds a live lease")

    def _entry(self, it: Item, now: Any) -> JournalEntry:
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

    # --- step 5: failures, twins and late outcomes --------------------------------------------------
    def _settle(self, conn: Connection, items: list[Item]) -> None:
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

    def _resolve_twins(self, items: list[Item]) -> None:
        for it in items:
            first = it.twin_of
            if first is None or it.decision is not None or first.decision is None:
                continue
            if first.decision.result is ConsumeResult.SUCCESS:
                self._decide(it, Reason.DUPLICATE_IN_BATCH)
            else:
                self._decide(it, Reason.LEASE_CONFLICT, "same message id earlier in this batch not done")

    # --- step 4: Redis after the commit -------------------------------------------------------------
    def _after_commit(self, items: list[Item]) -> None:
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
    def _database_down(self, items: list[Item], step: str, exc: BaseException) -> None:
        self.metrics.database_errors.labels(self.group, step).inc()
        log.warning("database unavailable during %s (group %s): %r", step, self.group, exc)
        for it in items:
            it.decision = None
            it.error = None
            self._decide(it, Reason.DATABASE_UNAVAILABLE, f"{step}: {exc!r}"[:300])

    def _redis_fallback(self, operation: str, exc: BaseException) -> None:
        self.metrics.redis_fallbacks.labels(operation).inc()

    def _finish(self, it: Item) -> Decision:
        d = it.decision
        if d is None:  # defensive: every path decides; if one did not, redelivery is the safe answer
            d = Decision(it.mid or None, Reason.DATABASE_UNAVAILABLE, "undecided")
        d = Decision(d.message_id, d.reason, d.detail, it.log_id, d.attempts, d.error)
        self._observe(d)
        for h in self.hooks:
            h.after_decision(it.env, d)
        return d
