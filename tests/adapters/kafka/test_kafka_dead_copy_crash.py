"""A group's dead letter reaches the dead-letter topic even when the process died right after giving up on a
copy that was labelled for another group.

Kafka cannot address one consumer group: the sweeper's resend for ``billing`` goes to the topic labelled
``reliable-target-group: billing``, and ``audit`` reads it too. If that copy is the one whose failure makes
``audit`` give up (its row ``DEAD``, the journal ``DEAD_LETTER``) and the process dies before the copy is
written to the DLT, the broker delivers the very same record again. It was answered as a duplicate of a
dead row (``duplicate_of_dead``, meant for *other* resends of a message already dead-lettered) and
acknowledged: the dead letter was never written. The redelivery of the fatal record must be dead-lettered.
Live Tansu, PostgreSQL and Redis (no mocks).
"""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, idempotent_consumer
from reliable import constants as C
from reliable.adapters.kafka import KafkaSender, RetryMode, RetryPolicy, ensure_topics
from reliable.demo.tansu import Tansu
from reliable.guard import Decision, GuardHooks
from reliable.models import MessageInbox, MessageLog
from reliable.sender import OutgoingMessage
from reliable.sweeper.resend import RESEND_PROPERTY
from reliable.types import ConsumeResult, LogOutcome, StubStatus
from tests.adapters.kafka.helpers import TIMEOUT_S, dead_letters, make_consumer

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.redis]


class ProcessDies(BaseException):
    """Stands for the process dying: raised past the consumer loop (which catches ``Exception`` only), so
    nothing after the guard's commit runs — no copy to the DLT, no offset commit."""


class DieOnFirstDeadLetter(GuardHooks):
    """Dies once, right after the guard committed its first dead letter (row DEAD, journal DEAD_LETTER)."""

    def __init__(self) -> None:
        self.armed = True

    def after_decision(self, env: Envelope, decision: Decision) -> None:
        if self.armed and decision.result is ConsumeResult.DEAD_LETTER:
            self.armed = False
            raise ProcessDies(f"killed after the guard dead-lettered {env.message_id}")


def test_the_fatal_copy_for_another_group_is_dead_lettered_again_after_a_crash(
    tansu: Tansu, rel: Reliability, topic: str, group: str
) -> None:
    billing, audit = group, f"audit-{group}"
    policy = RetryPolicy(delays_s=(0.1,), mode=RetryMode.BLOCKING)
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))

    def always_fails(env: Envelope, session: Session) -> None:
        raise RuntimeError("audit's handler is broken")

    # the producer's send never landed; the sweeper re-sends for billing, to the topic, labelled for billing:
    # the only copy audit ever reads, and the one whose failures make audit give up
    with KafkaSender(tansu.bootstrap) as sender:
        sender.send(
            OutgoingMessage(
                "m", topic, b"body-m", send_count=2, properties={RESEND_PROPERTY: "2"}, target_group=billing
            )
        )
    dies = DieOnFirstDeadLetter()
    handle_audit = idempotent_consumer(rel, group=audit, hooks=[dies])(always_fails)
    with (
        make_consumer(tansu.bootstrap, topic, audit, handle_audit, retry=policy) as consumer,
        pytest.raises(ProcessDies),
    ):
        consumer.run(timeout_s=TIMEOUT_S)
    with Session(rel.engine) as s:
        row = s.get(MessageInbox, (audit, "m"))
        assert row is not None and row.status is StubStatus.DEAD
        journaled = s.scalars(
            select(MessageLog.outcome).where(MessageLog.consumer_group == audit, MessageLog.message_id == "m")
        ).all()
        assert LogOutcome.DEAD_LETTER in journaled

    # a new process of audit: the record comes again (its offset was never committed)
    with make_consumer(tansu.bootstrap, topic, audit, handle_audit, retry=policy) as consumer:
        assert consumer.run(
            until=lambda: consumer.counts["dead_letter"] + consumer.counts["duplicate"] >= 1,
            timeout_s=TIMEOUT_S,
        )
        assert (consumer.counts["dead_letter"], consumer.counts["duplicate"]) == (1, 0)

    dead = dead_letters(tansu.bootstrap, topic, audit, "m", expect=1)
    assert len(dead) == 1  # the dead letter the crash kept from the DLT, with its reason
    assert dead[0].get(C.KAFKA_HEADER_REASON, "").startswith("gave_up")
