"""The vocabulary of the consumer guard: reasons, verdicts, decisions and hooks.

Expected outcomes are values, not exceptions: a :class:`Reason` alone fixes what the broker is told
(:class:`ConsumeResult`), what the journal records (:class:`LogOutcome`) and whether the delivery was a
suppressed duplicate — one table (:data:`OUTCOMES`) instead of the same three facts spread over the code.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from reliable.errors import BadMessageError, PayloadMismatchError
from reliable.stores import StubRow
from reliable.stores.sql import HANDLER_FAILED_PREFIX
from reliable.types import ConsumeResult, Envelope, LogOutcome, StubStatus


class Reason(enum.StrEnum):
    """Why the guard decided what it decided (also the prefix of ``message_log.reason``)."""

    PROCESSED = "processed"
    DUPLICATE_DONE_MARKER = "duplicate_done_marker"
    DUPLICATE_CONFIRMED = "duplicate_confirmed"
    DUPLICATE_IN_BATCH = "duplicate_in_batch"
    VOIDED = "voided"
    LEASE_CONFLICT = "lease_conflict"
    HANDLER_FAILED = HANDLER_FAILED_PREFIX
    MAX_ATTEMPTS = "max_attempts"
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
    Reason.VOIDED: (_S, LogOutcome.SUCCESS, False),
    Reason.LEASE_CONFLICT: (_R, LogOutcome.RETRY, False),
    Reason.HANDLER_FAILED: (_R, LogOutcome.RETRY, False),
    Reason.MAX_ATTEMPTS: (_D, LogOutcome.DEAD_LETTER, False),
    Reason.PAYLOAD_MISMATCH: (_D, LogOutcome.DEAD_LETTER, False),
    Reason.MISSING_MESSAGE_ID: (_D, LogOutcome.DEAD_LETTER, False),
    Reason.BAD_MESSAGE: (_D, LogOutcome.DEAD_LETTER, False),
    Reason.DATABASE_UNAVAILABLE: (_R, LogOutcome.RETRY, False),
    Reason.CONFIRM_CONFLICT: (_R, LogOutcome.RETRY, False),
}


class Verdict(enum.Enum):
    """What the (locked) stub row says about running the handler."""

    RUN = "run"  # PENDING or DEAD stub of our group: run, then confirm conditionally
    RUN_INBOX = "run_inbox"  # we just inserted a CONFIRMED inbox row: run
    DUPLICATE = "duplicate"
    VOIDED = "voided"
    MISMATCH = "mismatch"
    FOREIGN_GROUP = "foreign_group"
    VANISHED = "vanished"  # a concurrent insert we waited on was rolled back, then the row was gone


def judge(stub: StubRow | None, claimed: bool, group: str, payload_hash: str | None) -> Verdict:
    """The stub-state transition table of step 3 (pure, so it is property-tested on its own)."""
    if claimed:
        return Verdict.RUN_INBOX
    if stub is None:
        return Verdict.VANISHED
    if stub.consumer_group != group:
        return Verdict.FOREIGN_GROUP
    if payload_hash is not None and stub.payload_hash is not None and stub.payload_hash != payload_hash:
        return Verdict.MISMATCH
    if stub.status is StubStatus.CONFIRMED:
        return Verdict.DUPLICATE
    if stub.status is StubStatus.VOIDED:
        return Verdict.VOIDED
    return Verdict.RUN


@dataclass(frozen=True, slots=True)
class Decision:
    """The full answer for one delivery: adapters use ``result``; demos and tests read the rest."""

    message_id: str | None
    reason: Reason
    detail: str | None = None
    #: the ``message_log`` row; ``None`` when journaling failed or the row waits in the write-behind journal
    log_id: int | None = None
    attempts: int | None = None
    error: BaseException | None = None

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


def verdict_decision(
    v: Verdict, message_id: str, group: str, payload_hash: str | None, stub: StubRow | None
) -> tuple[Reason, str | None, BaseException | None]:
    """The reason, detail and (for bad input) the typed error of a verdict that does not run the handler."""
    if v is Verdict.DUPLICATE:
        return Reason.DUPLICATE_CONFIRMED, None, None
    if v is Verdict.VOIDED:
        return Reason.VOIDED, "stub was voided by the producer", None
    if v is Verdict.MISMATCH:
        err: BaseException = PayloadMismatchError(
            f"message {message_id!r}: body sha256 {payload_hash} differs from the recorded "
            f"{stub.payload_hash if stub else None}"
        )
        return Reason.PAYLOAD_MISMATCH, str(err), err
    if v is Verdict.FOREIGN_GROUP:
        err = BadMessageError(
            f"message {message_id!r}: its stub belongs to consumer group "
            f"{stub.consumer_group if stub else None!r}, not {group!r} (message_stub is keyed by id)"
        )
        return Reason.BAD_MESSAGE, str(err), err
    # VANISHED: an insert we waited on was rolled back and its row is gone; try again later
    return Reason.CONFIRM_CONFLICT, "stub row vanished while we waited for it", None
