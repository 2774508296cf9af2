"""What to do with one selected inbox row: re-send it, leave it queued, or raise the never-consumed alarm.

The selection (:mod:`reliable.sweeper.selection`) returns every due, unconfirmed row of a group that either
never received the message or holds a stale delivery. This module decides, row by row, with three facts the
SQL cannot have: the group's watermark on the queue its newest copy went to (``%RETRY%{group}`` after a
targeted resend; a queue is ``(topic, broker_name, queue_id)``: on a RocketMQ cluster each broker group's
queue 0 has its own offsets, see :mod:`reliable.sweeper.queues`), the broker's max and min offsets of
that queue (the :class:`~reliable.sender.BrokerProbe` and :class:`~reliable.sender.RetentionProbe`), and
the broker's own retry schedule. DESIGN.md §3 in order, with one rule of ours (``EXPIRED``):

=================  =====================================================================================
``NEVER_SENT``      no send ever landed (``queue_offset`` null): send                              → resend
``OVERTAKEN``       the group's watermark on that queue is at or past the copy's offset, and the
                    group has no delivery of it: the broker lost it and reused the offset (``<=``: the
                    watermark is the highest offset *received*, journaled with its log row)    → resend
``LOST``            the broker's max offset of that queue (one past its last message) is at or below
                    the copy's offset: the broker does not have it — found on a quiet queue too, and
                    for a group that never consumed the queue                                  → resend
``EXPIRED``         the broker's min offset of that queue (its first stored message) is above the
                    copy's offset and the group has no delivery of it: the broker deleted it by its
                    retention before the group read it (a group stopped longer than the retention on a
                    quiet queue, where no watermark overtakes it)                             → resend
``TOO_OLD``         no probe answer (RabbitMQ has none, a broker that is down) and the copy was sent
                    longer than ``max_unconfirmed_age`` ago: the last resort                   → resend
``STUCK``           delivered, still pending, newest delivery older than ``stuck_after`` and past the
                    broker's own retry of it. Waits for a held lease (below) — one without a TTL,
                    which nothing ends, or one Redis cannot tell (down), only until the message is
                    ``max_unconfirmed_age + stuck_after`` old: until 2026-11-29 held for ever (for
                    the whole outage), PENDING, nobody told                                   → resend
``NEVER_CONSUMED``  the broker has it (or no probe answers: RabbitMQ), the group has no watermark on
                    that queue of the topic at all, and the copy is older than ``stuck_after``: the
                    group never consumed there (not
                    subscribed, wrong topic, consumer never started — or it started after the message
                    from the queue's end and the broker will never deliver it). Alarm (metric + one
                    notice), no resend until the copy is older than ``max_unconfirmed_age``: then
                    ``TOO_OLD`` where the sender can target the group (until 2026-11-28 held for ever:
                    a group that skipped its backlog on a quiet topic never got it); on Kafka and
                    RocketMQ 5.x, whose resends land on the shared topic, held. (A younger copy is
                    ``QUEUED``: the group may be starting up. A targeted copy on ``%RETRY%{group}``
                    without a watermark, or a copy whose group keeps only an unnamed position on a
                    cluster, is ``QUEUED`` until
                    ``max_unconfirmed_age``, then ``TOO_OLD``: no position to judge it by; so is
                    a targeted copy behind the group's position there, which no stall alarm
                    watches.) A copy whose queue the send did not tell (RocketMQ 5.x) and whose
                    group has no watermark on any queue of its topic: the same alarm.          → hold
``QUEUED``          the broker has it above the group's watermark: it is waiting in the backlog  → hold
``BROKER_RETRY``    the newest delivery asked for a retry and the broker's delay for it has not
                    passed: the broker will redeliver; re-sending now would race it            → hold
=================  =====================================================================================

Every ``→ resend`` waits for the message's held Redis lease, read by the sweeper
(:func:`reliable.sweeper.leases.defers_resend`): a worker is in the handler, or one killed in it left its
lease and its copy is back on the broker — it journaled nothing, so the row looks never received, and until
2026-11-29 was re-sent as ``TOO_OLD`` or ``OVERTAKEN`` beside that copy. A never-received row waits only
until its copy is ``max_unconfirmed_age + stuck_after`` old, a ``STUCK`` row held by a key without a TTL,
or while Redis cannot be read (``lease_unknown``), only until the message is (counted from its stage: each
resend meets the key and is journaled, which would restart a count from the newest delivery): a lease that
never ends, or an outage of Redis however long, cannot keep a row pending unseen — past it the resend is
made, or at the budget the give-up and its notice. The resend cannot be applied twice: the key refuses the
copy, and with Redis down the guard decides on the database alone (the group's inbox row, locked by the
work transaction, admits one delivery). A stuck row whose lease expires waits for it however old it is: a
worker is on it. Reads failing for longer than ``stuck_after`` are said every round (an ERROR, and the
gauge ``reliable_sweeper_redis_unreadable_seconds``) and told to a person once an outage
(:mod:`reliable.sweeper.redis_outage`: kept in the database, so a sweeper run once by cron says it too).

The broker's retry schedule is RocketMQ's: a delivery answered ``RECONSUME_LATER`` with
``reconsume_times = r`` comes back after delay level ``3 + r`` (``1s 5s 10s 30s 1m 2m … 2h``), and after
``max_reconsume_times`` (16) it goes to the DLQ and never comes back — from then on only the stuck rule can
recover it. Brokers with another schedule pass their own :data:`RetrySchedule`.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable
from dataclasses import dataclass

from reliable import constants as C
from reliable.sweeper.backoff import parse_duration
from reliable.sweeper.selection import Candidate
from reliable.types import LogOutcome


class Verdict(enum.Enum):
    NEVER_SENT = "never_sent"
    OVERTAKEN = "overtaken"
    LOST = "lost"
    EXPIRED = "expired"
    TOO_OLD = "too_old"
    STUCK = "stuck"
    NEVER_CONSUMED = "never_consumed"
    QUEUED = "queued"
    BROKER_RETRY = "broker_retry"

    @property
    def resend(self) -> bool:
        return self in _RESEND


_RESEND = frozenset(
    {Verdict.NEVER_SENT, Verdict.OVERTAKEN, Verdict.LOST, Verdict.EXPIRED, Verdict.TOO_OLD, Verdict.STUCK}
)

#: how long after a delivery answered RECONSUME_LATER (with its ``reconsume_times``) the broker redelivers;
#: ``None``: it will not (the message went to the dead-letter queue).
RetrySchedule = Callable[[int], "dt.timedelta | None"]


@dataclass(frozen=True, slots=True)
class RocketMQRetrySchedule:
    """RocketMQ 4.x: delay level ``3 + reconsume_times`` of ``messageDelayLevel``; DLQ after the maximum."""

    levels_s: tuple[float, ...] = tuple(parse_duration(d) for d in C.ROCKETMQ_DELAY_LEVELS.split())
    max_reconsume_times: int = C.DEFAULT_MAX_ATTEMPTS

    def __call__(self, reconsume_times: int) -> dt.timedelta | None:
        if reconsume_times >= self.max_reconsume_times:
            return None
        level = min(3 + max(reconsume_times, 0), len(self.levels_s))
        return dt.timedelta(seconds=self.levels_s[level - 1])


@dataclass(frozen=True, slots=True)
class Facts:
    """What the sweeper learned about a row's queue before judging it."""

    #: the group's ``consume_progress.max_offset`` on the copy's (topic, queue); ``None``: no row
    watermark: int | None
    #: the broker's max offset of that queue; ``None``: no probe, or it could not tell
    broker_max: int | None
    #: the broker's min offset of that queue (its first stored message); ``None``: not asked, or cannot tell
    broker_min: int | None = None
    #: the group has a watermark row that may be this queue's though it is not keyed by its broker group (a
    #: row written before migration 0006): not an alarm (see reliable/sweeper/queues.py)
    legacy_position: bool = False
    #: the group never consumed where this copy is: no position at all on its queue (a real one, not an
    #: unnamed queue on a cluster), or — the send did not tell the queue (RocketMQ 5.x) — on any queue of its
    #: topic. Known from the group's watermarks alone, probe or not
    unconsumed: bool = False


def judge(
    cand: Candidate,
    facts: Facts,
    *,
    now: dt.datetime,
    stuck_after: dt.timedelta,
    max_unconfirmed_age: dt.timedelta,
    retry_schedule: RetrySchedule,
    resend_to_group_only: bool = True,
) -> Verdict:
    """The verdict for one row (see the module docstring's table, which this follows line by line).

    ``resend_to_group_only``: the sender puts a targeted resend where only the row's group reads it (not
    Kafka's or RocketMQ 5.x's topic, where every group gets each copy)."""
    if cand.stuck:
        return _judge_stuck(cand, now=now, stuck_after=stuck_after, retry_schedule=retry_schedule)
    offset = cand.queue_offset
    if offset is None:
        return Verdict.NEVER_SENT
    sent = cand.last_sent_at or cand.created_at
    if facts.watermark is not None and offset <= facts.watermark:
        return Verdict.OVERTAKEN
    if facts.broker_max is not None:
        if facts.broker_max <= offset:
            return Verdict.LOST
        if facts.broker_min is not None and offset < facts.broker_min:
            return Verdict.EXPIRED
        old = now - sent >= max_unconfirmed_age
        if facts.watermark is not None:
            # behind the group's position: queued — but a targeted copy on %RETRY%{group} is not watched by
            # the stall alarm (it follows the topic's queues), so a group that stopped would hold it for ever
            return Verdict.TOO_OLD if cand.targeted and old else Verdict.QUEUED
        if facts.legacy_position or cand.targeted:
            # consumed here, but no position to compare the copy with: the group's only row is unnamed (a
            # client that cannot name the broker group — its losses leave no other trace), or the copy is on
            # %RETRY%{group}, which any clustering consumer reads but a broadcasting one never does. Not an
            # alarm; and not queued for ever either: the age rule decides, as without a probe
            return Verdict.TOO_OLD if old else Verdict.QUEUED
        # no position on the queue at all: an alarm, unless the copy is young (a group starting up) — and
        # not held for ever: a group that started after the message from the queue's end
        # (CONSUME_FROM_LAST_OFFSET, an offset reset) is subscribed, is never given it, and reads a resend.
        # Only where the resend reaches that group alone: on a shared topic a group not deployed yet would
        # have every other group take a copy of each message at every resend, for days
        if old and resend_to_group_only:
            return Verdict.TOO_OLD
        return Verdict.NEVER_CONSUMED if now - sent >= stuck_after else Verdict.QUEUED
    old = now - sent >= max_unconfirmed_age
    if facts.unconsumed and not cand.targeted and not (old and resend_to_group_only):
        # no probe answer (RabbitMQ has none; a broker that does not answer; a 5.x send names no queue) — but
        # the group has never consumed there, which needs no broker to know: the same alarm as above. Until
        # 2026-11-29 a RabbitMQ group whose consumers were never deployed raised none (a day later every
        # message was re-sent into the queue nobody reads, until each went DEAD, no cause named), and on a
        # shared 5.x topic each such resend gave every other group a copy
        return Verdict.NEVER_CONSUMED if now - sent >= stuck_after else Verdict.QUEUED
    return Verdict.TOO_OLD if old else Verdict.QUEUED


def _judge_stuck(
    cand: Candidate, *, now: dt.datetime, stuck_after: dt.timedelta, retry_schedule: RetrySchedule
) -> Verdict:
    assert cand.last_received_at is not None
    if cand.last_outcome is LogOutcome.RETRY and cand.last_reconsume_times is not None:
        delay = retry_schedule(cand.last_reconsume_times)
        if delay is not None and now < retry_window_end(cand.last_received_at, delay, stuck_after):
            return Verdict.BROKER_RETRY
    return Verdict.STUCK


def retry_window_end(received_at: dt.datetime, delay: dt.timedelta, stuck_after: dt.timedelta) -> dt.datetime:
    """Until when the broker's redelivery is expected (its delay, plus ``stuck_after`` for it to be taken)."""
    return received_at + delay + stuck_after
