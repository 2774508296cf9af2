"""The per-delivery state of the guard and every step that is pure bookkeeping over it.

Why separate from I/O: these functions decide *what* to ask the stores and *what* the answers mean, never
*how* to ask. The synchronous orchestrator (:mod:`reliable.guard.core`) and an ``async def`` one call the same
functions and differ only in their ``await``s. Nothing here touches a database, Redis or a clock (``now`` is
passed in).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from reliable import constants as C
from reliable.errors import BadMessageError, MissingMessageIdError, PayloadMismatchError
from reliable.guard.decision import (
    TEXTS,
    Decision,
    Reason,
    Verdict,
    held_verdict,
    judge,
    lease_wait_ms,
    twin_reason,
    verdict_reason,
)
from reliable.guard.storable import clamped_attempts, storable, unfit
from reliable.stores import InboxRow, InboxState, JournalEntry, LeaseAnswer, LeaseState, OutcomeUpdate
from reliable.stores.lease import done_value, lease_key, processing_value
from reliable.stores.sql import reason_text
from reliable.types import Envelope


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
    claimed: bool = False  # this transaction inserted the group's inbox row (inbox pattern)
    twin_of: Item | None = None  # same id earlier in this batch
    log_id: int | None = None
    decision: Decision | None = None
    error: BaseException | None = None
    written: bool = False  # the journal row carries the final outcome
    held: bool = False  # the fast path found a live lease of another worker
    retry_after_ms: int | None = None  # LEASE_CONFLICT on a held lease: until it can have run out
    ran: bool = False  # the handler ran in the current work transaction
    worker: str = ""
    #: what the handler left to do once its writes are committed (messages it staged: their sends)
    after_commit: list[Callable[[], None]] = field(default_factory=list)

    @property
    def inbox_row(self) -> InboxRow:
        return InboxRow(self.mid, self.payload_hash)


def decide(
    it: Item,
    reason: Reason,
    detail: str | None = None,
    *,
    error: BaseException | None = None,
    attempts: int | None = None,
) -> None:
    """Record the first decision of ``it`` (later ones are ignored: the first way out wins)."""
    if it.decision is None:
        it.decision = Decision(it.mid or None, reason, detail, None, attempts, error)


# --- step 0: bad input, twins, lease keys ---------------------------------------------------------------
def prepare(
    envs: Sequence[Envelope], *, group: str, key_prefix: str, check_payload: bool, owner: Callable[[], str]
) -> list[Item]:
    """One :class:`Item` per delivery: bad input decided, twins linked to their first, lease keys set."""
    items: list[Item] = []
    first: dict[str, Item] = {}
    for delivered in envs:
        attempts = clamped_attempts(delivered.reconsume_times)
        env = (
            delivered
            if attempts == delivered.reconsume_times
            else replace(delivered, reconsume_times=attempts)
        )
        mid = env.message_id or ""
        it = Item(env, mid, hashlib.sha256(env.body).hexdigest() if check_payload else None)
        fault = unfit(env)
        if env.bad_input is not None:  # the adapter could not read it: journaled as bad input, never run
            unreadable = BadMessageError(env.bad_input)
            it.env = storable(env)
            it.mid = (it.env.message_id or "")[: C.MESSAGE_ID_MAX]
            decide(it, Reason.BAD_MESSAGE, str(unreadable), error=unreadable)
        elif fault is not None:  # before any statement: a database error here would be retried for ever
            bad = BadMessageError(f"{fault}: no column can hold it")
            it.env = storable(env)
            it.mid = (it.env.message_id or "")[: C.MESSAGE_ID_MAX]
            decide(it, Reason.BAD_MESSAGE, str(bad), error=bad)
        elif not mid.strip():  # blank is no id: every blank delivery would be one message's duplicate
            err = MissingMessageIdError(
                f"delivery topic={env.source_topic} queue={env.queue_id} offset={env.queue_offset} "
                "has no message id"
            )
            decide(it, Reason.MISSING_MESSAGE_ID, str(err), error=err)
        elif (
            len(mid) > C.MESSAGE_ID_MAX or len(env.topic) > C.TOPIC_MAX or len(env.source_topic) > C.TOPIC_MAX
        ):
            err2 = BadMessageError(
                f"message id ({len(mid)} chars) or topic ({len(env.source_topic)} chars) exceeds its column"
            )
            it.mid = mid[: C.MESSAGE_ID_MAX]
            decide(it, Reason.BAD_MESSAGE, str(err2), error=err2)
        elif mid in first:
            it.twin_of = first[mid]
        else:
            first[mid] = it
            it.key = lease_key(key_prefix, group, mid)
            it.lease_value = processing_value(owner())
        items.append(it)
    return items


# --- step 2: the Redis fast path ------------------------------------------------------------------------
def lease_candidates(items: Sequence[Item]) -> list[Item]:
    """The deliveries that ask Redis: undecided and not a twin."""
    return [it for it in items if it.decision is None and it.twin_of is None]


def apply_leases(todo: Sequence[Item], answers: Sequence[LeaseAnswer]) -> None:
    for it, ans in zip(todo, answers, strict=True):
        if ans.state is LeaseState.ACQUIRED:
            it.owned = True
        elif ans.state is LeaseState.DONE:
            h = it.payload_hash
            if h is None or ans.done_hash is None or h.startswith(ans.done_hash):
                decide(it, Reason.DUPLICATE_DONE_MARKER)
            # else: a different body under a done id; the database check raises the mismatch
        elif ans.state is LeaseState.HELD:
            it.held = True


#: whether the group's journal holds a ``DEAD_LETTER`` row at a delivery's position — or, with the flag, at
#: any position of its topic (the guard asks the database;
#: :meth:`reliable.stores.sql_journal.JournalSql.dead_lettered_at`)
DeadLetteredAt = Callable[[JournalEntry, bool], bool]


def judge_row(
    it: Item,
    state: InboxState | None,
    max_attempts: int,
    group: str,
    dead_lettered_at: DeadLetteredAt | None = None,
) -> Verdict:
    """:func:`~reliable.guard.decision.judge` of ``it`` over ``group``'s inbox row (``None``: no row).

    Only a copy that would be answered a duplicate of a dead row (:attr:`Verdict.DEAD_COPY`) asks
    ``dead_lettered_at`` whether the group dead-lettered this very record before (a redelivery after a crash
    that kept its dead letter from the broker): a rare row, so the question costs the hot path nothing.
    A revived delivery (:attr:`Envelope.revived`: RocketMQ 5.x's pop retry topic) is never at the fatal
    record's position, so for it any ``DEAD_LETTER`` row of the message on its topic counts: wrong, that is
    one more dead letter of a message already dead-lettered, never a lost one."""
    if state is None:
        return judge(None, None, it.claimed, it.payload_hash)
    target = it.env.target_group
    facts = (state.status, state.payload_hash, it.claimed, it.payload_hash, state.attempts, max_attempts)
    other = bool(target) and target != group
    v = judge(*facts, for_other_group=other)
    if v is Verdict.DEAD_COPY and dead_lettered_at is not None:
        here = journal_entry(it, group, None)  # the delivered position, as the journal holds it
        v = judge(*facts, for_other_group=other, fatal_record=dead_lettered_at(here, it.env.revived))
    return v


def decide_held(
    it: Item,
    state: InboxState | None,
    max_attempts: int,
    group: str,
    dead_lettered_at: DeadLetteredAt | None = None,
) -> None:
    """Another worker holds the lease: a settled inbox row answers now, anything else is a lease conflict."""
    v = judge_row(it, state, max_attempts, group, dead_lettered_at)
    if held_verdict(v) is None:
        decide(it, Reason.LEASE_CONFLICT, TEXTS["held"])
    else:
        decide_verdict(it, v, state)


def lease_conflicts(items: Sequence[Item]) -> list[Item]:
    """The deliveries answered ``LEASE_CONFLICT`` because another worker holds their lease (not twins)."""
    return [
        it
        for it in items
        if it.held and it.decision is not None and it.decision.reason is Reason.LEASE_CONFLICT
    ]


def apply_lease_waits(conflicts: Sequence[Item], pttls: Sequence[int | None], lease_ms: int) -> None:
    for it, pttl in zip(conflicts, pttls, strict=True):
        it.retry_after_ms = lease_wait_ms(pttl, lease_ms)


def decide_verdict(it: Item, v: Verdict, state: InboxState | None) -> None:
    reason, detail, error = verdict_reason(v, it.mid, it.payload_hash, state.payload_hash if state else None)
    decide(it, reason, detail, error=error)


def resolve_twins(items: Sequence[Item]) -> None:
    """Twins of a decided delivery share its fate; one with a different body never answers SUCCESS."""
    for it in items:
        first = it.twin_of
        if first is None or it.decision is not None or first.decision is None:
            continue
        same = it.payload_hash is None or first.payload_hash is None or it.payload_hash == first.payload_hash
        reason = twin_reason(first.decision.reason, same)
        if reason is Reason.PAYLOAD_MISMATCH:
            err = PayloadMismatchError(
                f"message {it.mid!r}: body sha256 {it.payload_hash} differs from {first.payload_hash} "
                "of the same id earlier in this batch"
            )
            decide(it, reason, str(err), error=err)
        else:
            decide(it, reason, TEXTS["twin_pending"] if reason is Reason.LEASE_CONFLICT else None)


# --- step 1: the journal ----------------------------------------------------------------------------------
def journal_entry(it: Item, group: str, now: Any) -> JournalEntry:
    """The ``message_log`` row of a delivery: the *delivered* position, the original topic beside it."""
    d = it.decision
    env = it.env
    return JournalEntry(
        message_id=it.mid,
        consumer_group=group,
        topic=env.source_topic[: C.TOPIC_MAX],
        queue_id=env.queue_id,
        queue_offset=env.queue_offset,
        reconsume_times=env.reconsume_times,
        received_at=now,
        worker=it.worker[:128],
        outcome=None if d is None else d.outcome,
        reason=None if d is None else reason_text(d.reason.value, d.detail),
        original_topic=env.topic[: C.TOPIC_MAX],
        broker_name=env.broker_name[: C.BROKER_NAME_MAX],
    )


def split_done_duplicates(items: Sequence[Item]) -> tuple[list[Item], list[Item]]:
    """(deliveries Redis answered ``done`` — write-behind may buffer them, the rest — journaled now)."""
    deferred = [
        it for it in items if it.decision is not None and it.decision.reason is Reason.DUPLICATE_DONE_MARKER
    ]
    return deferred, [it for it in items if it not in deferred]


def outcome_update(it: Item) -> OutcomeUpdate:
    d = it.decision
    assert d is not None and it.log_id is not None
    return OutcomeUpdate(it.log_id, d.outcome, reason_text(d.reason.value, d.detail))


# --- step 3 and 5: the work transaction's ways out --------------------------------------------------------
def undo(run: Sequence[Item], reason: Reason, detail: str) -> None:
    """The work transaction rolled back as a whole: nothing in it happened, whatever was decided."""
    for it in run:
        it.error = None
        it.decision = None
        decide(it, reason, detail)


def database_down(items: Sequence[Item], step: str, exc: BaseException) -> None:
    for it in items:
        it.decision = None
        it.error = None
        decide(it, Reason.DATABASE_UNAVAILABLE, f"{step}: {exc!r}"[:300])


# --- step 4: Redis after the commit -----------------------------------------------------------------------
def after_commit_plan(items: Sequence[Item]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(keys to mark ``done``, leases to compare-and-delete) for the leases this call owns."""
    done: list[tuple[str, str]] = []
    release: list[tuple[str, str]] = []
    for it in items:
        if not it.owned:
            continue
        d = it.decision
        if d is not None and d.reason in (Reason.PROCESSED, Reason.DUPLICATE_CONFIRMED):
            done.append((it.key, done_value(it.payload_hash)))
        else:  # a redelivery may take the message at once
            release.append((it.key, it.lease_value))
    return done, release


def final_decision(it: Item, group: str) -> Decision:
    """The decision handed back; an undecided delivery (a bug) is answered with a safe retry."""
    d = it.decision or Decision(it.mid or None, Reason.DATABASE_UNAVAILABLE, TEXTS["undecided"])
    return Decision(
        d.message_id, d.reason, d.detail, it.log_id, d.attempts, d.error, group, it.retry_after_ms
    )
