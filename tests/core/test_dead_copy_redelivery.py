"""A group that gave up on a message because a copy labelled for another group kept failing still
dead-letters that very copy when the broker delivers it again.

Kafka and RocketMQ 5.x put the sweeper's resend for group ``billing`` on the topic, labelled for billing;
group ``audit`` reads it too. If that copy is the one whose failure makes audit give up (row ``DEAD``,
journal ``DEAD_LETTER``) and the process dies before the adapter copies it to the dead-letter path, the
broker delivers the same record again. The guard answered it ``duplicate_of_dead`` (meant for the *other*
resends of a message already dead-lettered) and the dead letter was never written. On every database, by
the work transaction and by the peek at a row another worker's lease still holds (a worker that died before
releasing it).
"""

from __future__ import annotations

from dataclasses import replace

import redis
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.guard import Reason
from reliable.stores.lease import lease_key, processing_value
from reliable.types import ConsumeResult
from tests.core.guard_helpers import env

AUDIT, BILLING = "audit", "billing"


def _broken(e: Envelope, session: Session) -> None:
    raise RuntimeError("audit's handler is broken")


def _gave_up_on(rel: Reliability, fatal: Envelope) -> None:
    """Audit's handler fails on ``fatal`` at the broker's last delivery: audit gives up (row DEAD)."""
    handle = idempotent_consumer(rel, group=AUDIT)(_broken)
    d = handle.decide(replace(fatal, last_attempt=True))
    assert (d.reason, d.result) == (Reason.MAX_ATTEMPTS, ConsumeResult.DEAD_LETTER)


def test_the_fatal_copy_redelivered_is_dead_lettered_again_other_copies_are_duplicates(
    rel: Reliability,
) -> None:
    fatal = replace(env("m"), target_group=BILLING)
    _gave_up_on(rel, fatal)
    handle = idempotent_consumer(rel, group=AUDIT)(_broken)
    again = handle.decide(fatal)  # the process died before the dead letter left: the same record again
    assert (again.reason, again.result) == (Reason.GAVE_UP, ConsumeResult.DEAD_LETTER)
    # another resend for billing (a new record): audit dead-lettered the message already
    other = handle.decide(replace(env("m"), target_group=BILLING))
    assert (other.reason, other.result) == (Reason.DUPLICATE_OF_DEAD, ConsumeResult.SUCCESS)


def test_the_fatal_copy_redelivered_while_a_dead_workers_lease_lingers_is_dead_lettered(
    rel: Reliability, redis_url: str, key_prefix: str
) -> None:
    fatal = replace(env("m"), target_group=BILLING)
    _gave_up_on(rel, fatal)
    client = redis.Redis.from_url(redis_url)
    key = lease_key(key_prefix, AUDIT, "m")
    client.set(key, processing_value("a-worker-that-died"), px=60_000)
    try:
        handle = idempotent_consumer(rel, group=AUDIT)(_broken)
        again = handle.decide(fatal)
        assert (again.reason, again.result) == (Reason.GAVE_UP, ConsumeResult.DEAD_LETTER)
        other = handle.decide(replace(env("m"), target_group=BILLING))
        assert (other.reason, other.result) == (Reason.DUPLICATE_OF_DEAD, ConsumeResult.SUCCESS)
    finally:
        client.delete(key)
        client.close()
