"""The vocabulary of the consumer guard: reasons, verdicts, the pure decision rules, decisions and hooks.

Why one module with no I/O and no store imports: every rule that turns facts into an answer lives here as a
pure function or table, so the synchronous guard (:mod:`reliable.guard.core`) and the asyncio guard run the
*same* rules and differ only in how they fetch the facts (issue 14: two copies of the algorithm are a defect),
and the rules can be property-tested without a database.

Expected outcomes are values, not exceptions: a :class:`Reason` alone fixes what the broker is told
(:class:`ConsumeResult`), what the journal records (:class:`LogOutcome`) and whether the delivery was a
suppressed duplicate — one table (:data:`OUTCOMES`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from reliable.errors import PayloadMismatchError
from reliable.types import ConsumeResult, Envelope, LogOutcome, StubStatus


class Reason(enum.StrEnum):
    """Why the guard decided what it decided (also the prefix of ``message_log.reason``)."""

    PROCESSED = "processed"
    DUPLICATE_DONE_MARKER = "duplicate_done_marker"
    DUPLICATE_CONFIRMED = "duplicate_confirmed"
    DUPLICATE_IN_BATCH = "duplicate_in_batch"
    DUPLICATE_OF_DEAD = "duplicate_of_dead"
    VOIDED = "voided"
    LEASE_CONFLICT = "lease_conflict"
    HANDLER_FAILED = "handler_failed"
    MAX_ATTEMPTS = "max_attempts"
    GAVE_UP = "gave_up"
    PAYLOAD_MISMATCH = "payload_mismatch"
    MISSING_MESSAGE_ID = "missing_message_id"
    BAD_MESSAGE = "bad_message"
    DATABASE_UNAVAILABLE = "database_unavailable"
    CONFIRM_CONFLICT = "confirm_conflict"


_S, _R, _D = ConsumeResult.SUCCESS, ConsumeResult.RECONSUME_LATER, ConsumeResult.DEAD_LETTER
#: reason → (what the broker is told, what the journal says, was it a suppressed duplicate)
OUTCOMES: dict[Reason, tuple[ConsumeResult, LogOutcome, bool]] = {
    Reason.PROCESSED: (_S, LogOutcome.SUCCESS, False),
    Reason.DUPLICATE_DONE_MARKER: (_S, LogOutcome.DUPLICATE, True),
    Reason.DUPLICATE_CONFIRMED: (_S, LogOutcome.DUPLICATE, True),
    Reason.DUPLICATE_IN_BATCH: (_S, LogOutcome.DUPLICATE, True),
    Reason.DUPLICATE_OF_DEAD: (_S, LogOutcome.DUPLICATE, True),
    Reason.VOIDED: (_S, LogOutcome.SUCCESS, False),
    Reason.LEASE_CONFLICT: (_R, LogOutcome.RETRY, False),
    Reason.HANDLER_FAILED: (_R, LogOutcome.RETRY, False),
    Reason.MAX_ATTEMPTS: (_D, LogOutcome.DEAD_LETTER, False),
    Reason.GAVE_UP: (_D, LogOutcome.DEAD_LETTER, False),
    Reason.PAYLOAD_MISMATCH: (_D, LogOutcome.DEAD_LETTER, False),
    Reason.MISSING_MESSAGE_ID: (_D, LogOutcome.DEAD_LETTER, False),
    Reason.BAD_MESSAGE: (_D, LogOutcome.DEAD_LETTER, False),
    Reason.DATABASE_UNAVAILABLE: (_R, LogOutcome.RETRY, False),
    Reason.CONFIRM_CONFLICT: (_R, LogOutcome.RETRY, False),
}

#: the fixed detail texts of ``message_log.reason`` (``reason: detail``)
TEXTS: dict[str, str] = {
    "held": "another worker holds a live lease",
    "voided": "voided by the producer",
    "vanished": "inbox row vanished while we waited for it",
    "twin_pending": "same message id earlier in this batch not done",
    "undecided": "undecided",
    "no_outcome": "could not record the outcome",
    "confirmed_meanwhile": "another worker applied it while this handler ran (its lease ran out) and failed",
    "gave_up": "the group gave up on this message (its handler failed max_attempts times; a person was "
    "told): not run again until it is revived",
    "dead_copy": "a resend meant for another group; this group gave up on the message and dead-lettered it "
    "already: not run, not dead-lettered again until it is revived",
}


class HandlerCancelled(Exception):
    """The handler's task was cancelled mid-handler (``async def`` handlers): a handler failure for the guard,
    re-raised as ``asyncio.CancelledError`` once the guard has rolled back and released the lease. It counts
    against ``max_attempts`` (a handler cancelled by its own timeout every time ends dead-lettered), but it
    never ends the row at the broker's last delivery: a service stopping then did not see the handler fail."""


class StrayCancel(Exception):
    """A ``CancelledError`` came out of an ``async def`` handler while nobody cancelled its task (a future a
    client library cancelled, a ``gather`` over a cancelled child): an ordinary handler failure. Taken for a
    cancel of the task, it was re-raised to the adapter — which catches ``Exception`` only, so the message
    was neither acknowledged nor requeued (RabbitMQ) or the whole consumer stopped (aiokafka) — and on the
    last attempt the row ended DEAD while the caller got ``CancelledError`` (until 2026-11-28)."""


class Verdict(enum.Enum):
    """What the group's (locked) inbox row says about running the handler."""

    RUN = "run"  # PENDING or DEAD row: run, then confirm conditionally
    RUN_INBOX = "run_inbox"  # we just inserted a CONFIRMED inbox row (inbox pattern): run
    DUPLICATE = "duplicate"
    VOIDED = "voided"
    MISMATCH = "mismatch"
    VANISHED = "vanished"  # a concurrent insert we waited on was rolled back, then the row was gone
    #: DEAD because its handler failed ``max_attempts`` times: a person decides (revive resets attempts)
    GAVE_UP = "gave_up"
    #: GAVE_UP, and this copy is a resend the sweeper meant for another group (a sender that cannot address
    #: one group put it on the topic): the dead letter was sent already, this copy is a settled duplicate —
    #: unless it is the record whose failure made the group give up, redelivered (then GAVE_UP)
    DEAD_COPY = "dead_copy"


def judge(
    status: StubStatus | None,
    stored_hash: str | None,
    claimed: bool,
    payload_hash: str | None,
    attempts: int = 0,
    max_attempts: int | None = None,
    for_other_group: bool = False,
    fatal_record: bool = False,
) -> Verdict:
    """Step 3's transition table over one group's inbox row (``status`` ``None``: no row).

    A DEAD row whose ``attempts`` reached ``max_attempts`` is one the guard gave up on: another copy of the
    message does not run the failing handler again until a person revives the row. A copy labelled for
    another group (``for_other_group``: :attr:`Envelope.target_group` names another group) is a settled
    duplicate — each resend for another group went to the topic and dead-lettered a copy here again, one DLT
    record per resend — unless it is the very record whose failure made the group give up (``fatal_record``:
    the group's ``DEAD_LETTER`` journal row is at this delivery's position): a process that died between the
    give-up's commit and the copy to the dead-letter path gets that record again, and acknowledging it as a
    duplicate lost the dead letter. Any other copy (the producer's, a producer's retry, a broker
    redelivery, a resend for this group) is dead-lettered with the reason: a redelivery may be of the very
    record whose dead letter a crash kept from the broker. Any other DEAD row (the sweeper gave up on a copy
    that never arrived) runs: a late copy is welcome."""
    if claimed:
        return Verdict.RUN_INBOX
    if status is None:
        return Verdict.VANISHED
    if payload_hash is not None and stored_hash is not None and stored_hash != payload_hash:
        return Verdict.MISMATCH
    if status is StubStatus.CONFIRMED:
        return Verdict.DUPLICATE
    if status is StubStatus.VOIDED:
        return Verdict.VOIDED
    if status is StubStatus.DEAD and max_attempts is not None and attempts >= max_attempts:
        return Verdict.DEAD_COPY if for_other_group and not fatal_record else Verdict.GAVE_UP
    return Verdict.RUN


def verdict_reason(
    v: Verdict, message_id: str, payload_hash: str | None, stored_hash: str | None
) -> tuple[Reason, str | None, BaseException | None]:
    """The reason, detail and (for bad input) typed error of a verdict that does not run the handler."""
    if v is Verdict.DUPLICATE:
        return Reason.DUPLICATE_CONFIRMED, None, None
    if v is Verdict.VOIDED:
        return Reason.VOIDED, TEXTS["voided"], None
    if v is Verdict.GAVE_UP:
        return Reason.GAVE_UP, TEXTS["gave_up"], None
    if v is Verdict.DEAD_COPY:
        return Reason.DUPLICATE_OF_DEAD, TEXTS["dead_copy"], None
    if v is Verdict.MISMATCH:
        err = PayloadMismatchError(
            f"message {message_id!r}: body sha256 {payload_hash} differs from the recorded {stored_hash}"
        )
        return Reason.PAYLOAD_MISMATCH, str(err), err
    return Reason.CONFIRM_CONFLICT, TEXTS["vanished"], None


def held_verdict(v: Verdict) -> Verdict | None:
    """A live lease of another worker: only a settled row answers now; anything else waits (None)."""
    settled = (Verdict.DUPLICATE, Verdict.VOIDED, Verdict.MISMATCH, Verdict.GAVE_UP, Verdict.DEAD_COPY)
    return v if v in settled else None


def lease_wait_ms(pttl: int | None, lease_ms: int) -> int | None:
    """How long a delivery answered ``LEASE_CONFLICT`` should wait before the broker redelivers it, from the
    ``PTTL`` of the other worker's lease: until that lease can have run out, never longer than a lease.

    Why: a worker killed mid-handler leaves its lease for up to ``lease_ms`` (60 s by default); redelivered
    every ``retry_delay_s`` (1 s) meanwhile, the message burnt a quorum queue's ``x-delivery-limit``
    (RabbitMQ 4's default: 20) and the *broker* dead-lettered it — no reason, handler never run, inbox row
    PENDING until the sweeper's stuck rule.

    =============  =================================================================
    ``pttl``       wait
    =============  =================================================================
    ``None``       ``None``: Redis could not tell, the adapter's own retry delay holds
    ``-2``         0: the lease is gone already (released or expired meanwhile)
    ``-1``         ``lease_ms``: a lease without expiry (not the guard's), one lease
    ``n > 0``      ``min(n, lease_ms)``
    =============  =================================================================
    """
    if pttl is None:
        return None
    if pttl == -1:
        return lease_ms
    return min(max(pttl, 0), lease_ms)


def failure_reason(attempts: int, max_attempts: int, last: bool = False) -> Reason:
    """After the group's ``attempts``-th handler failure: retry, or dead-letter once the budget is spent — or
    once the broker will not deliver the message again (``last``: :attr:`Envelope.last_attempt`)."""
    return Reason.MAX_ATTEMPTS if attempts >= max_attempts or last else Reason.HANDLER_FAILED


def dead_letter_error(env: Envelope, detail: str, limit: int = 2000) -> str:
    """``last_error`` of a group's inbox row the guard gave up on at ``max_attempts`` (what a person reads in
    the sweeper's notice; ``DEAD: `` as on the rows the sweeper gives up on)."""
    text = (
        f"DEAD: the handler failed at every attempt and the message was dead-lettered from {env.topic} "
        f"({Reason.MAX_ATTEMPTS.value}: {detail}); fix the handler, then revive it, or void it"
    )
    return text if len(text) <= limit else text[: limit - 1] + "…"


def twin_reason(first: Reason, same_body: bool) -> Reason:
    """A second delivery of one id inside one batch shares the first's fate — unless its body differs."""
    if OUTCOMES[first][0] is not ConsumeResult.SUCCESS:
        return Reason.LEASE_CONFLICT  # the first is not done: redelivery decides this one on its own
    return Reason.DUPLICATE_IN_BATCH if same_body else Reason.PAYLOAD_MISMATCH


@dataclass(frozen=True, slots=True)
class Decision:
    """The full answer for one delivery: adapters use ``result``; demos and tests read the rest."""

    message_id: str | None
    reason: Reason
    detail: str | None = None
    #: the ``message_log`` row; ``None`` when journaling failed or the row waits in the write-behind journal
    log_id: int | None = None
    #: the group's handler failures so far (set on HANDLER_FAILED / MAX_ATTEMPTS)
    attempts: int | None = None
    error: BaseException | None = None
    group: str = ""
    #: ``LEASE_CONFLICT`` with another worker's lease: how long until that lease can have run out
    #: (:func:`lease_wait_ms`); the RabbitMQ adapters hold the delivery unacked that long before requeueing
    #: it. ``None``: no such lease, or Redis could not tell.
    retry_after_ms: int | None = None

    @property
    def result(self) -> ConsumeResult:
        return OUTCOMES[self.reason][0]

    @property
    def outcome(self) -> LogOutcome:
        return OUTCOMES[self.reason][1]

    @property
    def duplicate(self) -> bool:
        return OUTCOMES[self.reason][2]


class GuardHooks:
    """Observability hooks (dramatiq style): subclass and override what you need; all are no-ops here."""

    def before_journal(self, envs: Sequence[Envelope]) -> None: ...
    def after_journal(self, envs: Sequence[Envelope], log_ids: Sequence[int]) -> None: ...
    def before_handler(self, env: Envelope) -> None: ...
    def after_handler(self, env: Envelope, error: BaseException | None) -> None: ...
    def after_decision(self, env: Envelope, decision: Decision) -> None: ...
