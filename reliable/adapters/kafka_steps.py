"""What a Kafka consumer loop does after each guard answer: the one decision of every Kafka flavour.

The confluent-kafka loop, the aiokafka loop and FastStream's Kafka subscriber differ only in how they pause,
seek, produce and commit; *which* of those happens for an answer — acknowledge, copy to a retry topic, copy
to the dead-letter topic with the reason, or hold the partition and try again — is :func:`next_step`, and
the counting around it is :class:`AnswerBook`. Pure code over :mod:`reliable.adapters.kafka_common`.
"""

from __future__ import annotations

import enum
import hashlib
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from reliable import constants as C
from reliable.adapters.kafka_common import (
    HOLD_REASONS,
    Record,
    RetryMode,
    RetryPolicy,
    UndecodableRecord,
    encode_headers,
    forward_headers,
    reason_of,
)
from reliable.types import ConsumeResult, Envelope

log = logging.getLogger("reliable.adapters.kafka")


class Step(enum.Enum):
    """What a consumer loop does with one record after the guard answered."""

    ACK = "ack"  # final: the offset may move past it
    FORWARD = "forward"  # copy to a retry topic, then the offset may move past it
    DEAD = "dead"  # copy to the dead-letter topic, then the offset may move past it
    HOLD = "hold"  # pause the partition and seek back: the record is delivered again after ``delay_s``


@dataclass(frozen=True, slots=True)
class Action:
    """One record's next step; ``topic``/``attempt``/``reason`` are what its copy carries."""

    step: Step
    reason: str = ""
    topic: str | None = None
    delay_s: float = 0.0
    attempt: int = 0
    duplicate: bool = False


def next_step(
    answer: object, env: Envelope, policy: RetryPolicy, held_before: int, failed_before: int = 0
) -> Action:
    """The decision of both Kafka consumer loops (confluent-kafka and aiokafka) for one guard answer.

    ``answer`` is a :class:`~reliable.types.ConsumeResult`, a guard decision (``.result``/``.reason``), or
    the exception a bare handler raised (retried like a failure). ``held_before``: consecutive holds of the
    partition's head record so far (blocking mode and infrastructure holds count them: the delay grows);
    ``failed_before``: how many of those were the handler's failures — in blocking mode only they use up the
    retries. An outage (a lease conflict, the database down) holds the record for as long as it lasts and
    never sends it to the dead-letter topic: it was never processed, and with no producer row nobody else
    would ever deliver it again.
    """
    if isinstance(answer, Exception):
        reason = f"handler raised {type(answer).__name__}: {answer}"
        result = ConsumeResult.RECONSUME_LATER
    else:
        result = answer if isinstance(answer, ConsumeResult) else getattr(answer, "result")  # noqa: B009
        reason = reason_of(answer, env)
    attempt = env.reconsume_times + 1
    dlt = policy.dlt_topic(env.topic)
    if result is ConsumeResult.SUCCESS:
        return Action(Step.ACK, duplicate=bool(getattr(answer, "duplicate", False)))
    if result is ConsumeResult.DEAD_LETTER:
        return Action(Step.DEAD, reason, dlt, attempt=attempt)
    outage = str(getattr(answer, "reason", "")) in HOLD_REASONS
    if policy.mode is RetryMode.BLOCKING or outage:
        failures = held_before + 1
        if policy.mode is RetryMode.BLOCKING and not outage and failed_before + 1 > len(policy.delays_s):
            return Action(
                Step.DEAD, f"retries exhausted after {failed_before + 1} attempts: {reason}", dlt, 0, attempt
            )
        delays = policy.delays_s or (1.0,)
        return Action(Step.HOLD, reason, delay_s=delays[min(failures, len(delays)) - 1], attempt=attempt)
    hop = policy.after_failure(env.topic, attempt)
    if hop.dead:
        return Action(
            Step.DEAD, f"retries exhausted after {attempt} attempts: {reason}", hop.topic, 0, attempt
        )
    return Action(Step.FORWARD, reason, hop.topic, hop.delay_s, attempt)


def copy_headers(
    rec: Record, headers: Mapping[str, str], env: Envelope, action: Action, id_header: str, group: str
) -> list[tuple[str, str | bytes | None]]:
    """The wire headers of the retry or dead-letter copy that ``action`` sends for consumer ``group``."""
    fwd = forward_headers(
        rec,
        headers,
        env,
        attempt=action.attempt,
        reason=action.reason,
        delay_s=action.delay_s,
        id_header=id_header,
        group=group,
    )
    return encode_headers(fwd)


class AnswerBook:
    """The bookkeeping every Kafka loop keeps around :func:`next_step`: answer counts, head failures.

    ``counts``: success, duplicate, retry_topic, dead_letter (and whatever the loop adds: held, undecodable,
    handler_error); ``failures``: consecutive failures of each partition's head record (holds count them).
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.failures: Counter[tuple[str, int]] = Counter()
        #: of ``failures``, the handler's own (an outage's holds are not): what blocking retries use up
        self.handler_failures: Counter[tuple[str, int]] = Counter()

    def step(self, tp: tuple[str, int], answer: object, env: Envelope, policy: RetryPolicy) -> Action:
        """The next step for ``answer``, counted (the caller acts on it)."""
        action = next_step(answer, env, policy, self.failures[tp], self.handler_failures[tp])
        if action.step is Step.HOLD:
            self.failures[tp] += 1
            if str(getattr(answer, "reason", "")) not in HOLD_REASONS:
                self.handler_failures[tp] += 1
            return action
        self.failures.pop(tp, None)
        self.handler_failures.pop(tp, None)
        if action.step is Step.ACK:
            self.counts["duplicate" if action.duplicate else "success"] += 1
        elif action.step is Step.DEAD:
            self.counts["dead_letter"] += 1
            log.warning("message %s dead-lettered to %s: %s", env.message_id, action.topic, action.reason)
        else:
            self.counts["retry_topic"] += 1
        return action


#: the journal's message id of an undecodable record is this and its delivered position: no id the adapter
#: derives starts so (a position id is ``topic-partition-offset``)
UNDECODABLE_ID_PREFIX = "undecodable:"


def undecodable_envelope(rec: Record, topic: str, exc: UndecodableRecord) -> Envelope:
    """The stand-in the guard journals an undecodable record of business topic ``topic`` as: its id is
    :data:`UNDECODABLE_ID_PREFIX` and the delivered position (the topic by a digest where the whole would not
    fit the id column); ``bad_input`` makes the guard dead-letter it without a run, so the reconciliation
    report counts it."""
    mid = f"{UNDECODABLE_ID_PREFIX}{rec.topic}-{rec.partition}-{rec.offset}"
    if len(mid) > C.MESSAGE_ID_MAX:
        digest = hashlib.blake2b(rec.topic.encode("utf-8"), digest_size=8).hexdigest()
        mid = f"{UNDECODABLE_ID_PREFIX}{digest}-{rec.partition}-{rec.offset}"
    return Envelope(
        message_id=mid,
        topic=topic,
        queue_id=rec.partition,
        queue_offset=rec.offset,
        body=bytes(rec.value or b""),
        delivered_topic=None if rec.topic == topic else rec.topic,
        bad_input=f"undecodable: {exc}",
    )


def unjournaled(answer: object) -> bool:
    """Whether the guard's answer for a stand-in says its row was not written (the database is down, the
    guard raised): the record is then held, never committed past."""
    return isinstance(answer, Exception) or str(getattr(answer, "reason", "")) in HOLD_REASONS
