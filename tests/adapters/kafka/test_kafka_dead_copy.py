"""A group that gave up on a message gets one dead letter for it, however many resends other groups need.

Kafka cannot address one consumer group: the sweeper's resend for group A goes to the topic labelled
``reliable-target-group: A``, and every group reads it. Group B, whose row for the message is ``DEAD`` (its
handler failed at every attempt; dead-lettered once, a person told), answered each such copy ``gave_up`` and
the consumer dead-lettered it again — a second, third … record in the DLT for a dead letter already handled.
Live Tansu, PostgreSQL and Redis (no mocks).
"""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.adapters.kafka import KafkaSender, RetryMode, RetryPolicy, ensure_topics
from reliable.demo.tansu import Tansu
from reliable.models import MessageInbox
from reliable.sender import OutgoingMessage
from reliable.sweeper.resend import RESEND_PROPERTY
from reliable.types import StubStatus
from tests.adapters.kafka.helpers import (
    TIMEOUT_S,
    apply_effect,
    dead_letters,
    effect_counts,
    make_consumer,
    produce,
    with_ids,
)

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.redis]


def test_a_resend_for_another_group_is_not_dead_lettered_again_by_a_group_that_gave_up(
    tansu: Tansu, rel: Reliability, topic: str, group: str
) -> None:
    billing, audit = group, f"audit-{group}"
    policy = RetryPolicy(delays_s=(0.1,), mode=RetryMode.BLOCKING)
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))

    def always_fails(env: Envelope, session: Session) -> None:
        raise RuntimeError("audit's handler is broken")

    produce(tansu.bootstrap, topic, with_ids(["m"]))
    handle_audit = idempotent_consumer(rel, group=audit)(always_fails)
    with make_consumer(tansu.bootstrap, topic, audit, handle_audit, retry=policy) as consumer:
        assert consumer.run(until=lambda: consumer.counts["dead_letter"] >= 1, timeout_s=TIMEOUT_S)
        with Session(rel.engine) as s:
            row = s.get(MessageInbox, (audit, "m"))
            assert row is not None and row.status is StubStatus.DEAD

        # billing has not got its copy: the sweeper re-sends it, to the topic (the copy it sends for billing)
        with KafkaSender(tansu.bootstrap) as sender:
            resend = OutgoingMessage(
                "m", topic, b"body-m", send_count=2, properties={RESEND_PROPERTY: "2"}, target_group=billing
            )
            sender.send(resend)
        assert consumer.run(
            until=lambda: consumer.counts["dead_letter"] + consumer.counts["duplicate"] >= 2,
            timeout_s=TIMEOUT_S,
        )
        assert (consumer.counts["dead_letter"], consumer.counts["duplicate"]) == (1, 1)

    dead = dead_letters(tansu.bootstrap, topic, audit, "m", expect=1)
    assert len(dead) == 1  # one dead letter for (m, audit): the one the give-up sent

    # billing comes up: applies the message once, the resend is its duplicate
    handle_billing = idempotent_consumer(rel, group=billing)(apply_effect(billing))
    with make_consumer(tansu.bootstrap, topic, billing, handle_billing, retry=policy) as consumer:
        assert consumer.run(
            until=lambda: consumer.counts["success"] + consumer.counts["duplicate"] >= 2, timeout_s=TIMEOUT_S
        )
    assert effect_counts(rel.engine, billing) == {"m": 1}
