"""Sorting one claimed batch: which rows to send, which to hold, which go DEAD, which raise the alarm.

Runs in the claiming transaction, after the selection (:mod:`.selection`) and before any send:

1. the rows get their stubs (topic, body, first send); a row whose stub is gone has nothing to re-send: it
   waits ``stuck_after`` at a time (a copy already sent may still be received) and goes DEAD, with a notice,
   once it has been unconfirmed for ``max_unconfirmed_age``;
2. the facts of each row's queue — ``(topic, broker_name, queue_id)``, :mod:`.queues` — are gathered once
   per queue: the group's watermark (one ``consume_progress`` statement for the batch) and, where the
   watermark does not already decide, the broker's max offset (one probe call per queue and round) and,
   where the broker still has offsets above the copy's, its min offset (did its retention delete the copy?);
3. each row is judged (:func:`reliable.sweeper.verdict.judge`); a stuck row's Redis lease is read;
4. rows that must wait are postponed (their ``resend_at`` moves, so they do not take batch slots every
   round), spent rows whose copy is not coming go DEAD, never-consumed queues raise their alarm once, and
   the rest is returned to be sent.
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection

from reliable import constants as C
from reliable.sender import BrokerProbe, RetentionProbe
from reliable.stores import LeaseState
from reliable.sweeper import metrics
from reliable.sweeper.backoff import BacklogEstimator, BackoffPolicy
from reliable.sweeper.giveup import NO_STUB, give_up_reason, mark_dead, no_stub_reason, raise_never_consumed
from reliable.sweeper.leases import LeaseView
from reliable.sweeper.queues import Position, QueueIdKey, Watermarks, resolve
from reliable.sweeper.resend import BatchResult, copy_topic, postpone, targets_groups
from reliable.sweeper.selection import Candidate, load_stubs
from reliable.sweeper.verdict import Facts, RetrySchedule, Verdict, judge, retry_window_end

log = logging.getLogger("reliable.sweeper")


class End(enum.Enum):
    """Which end of a queue a probe call asks for."""

    MAX = "max"
    MIN = "min"


@dataclass
class Triage:
    """What the sweeper knows for the whole round: its settings and the probe answers so far."""

    sender: object
    probe: BrokerProbe | None
    policy: BackoffPolicy
    max_sends: int
    stuck_after: dt.timedelta
    max_unconfirmed_age: dt.timedelta
    retry_schedule: RetrySchedule
    lease_hold: dt.timedelta
    channels: Sequence[str]
    #: (end, topic, broker_name, queue_id) → the broker's max or min offset, asked once per round
    probed: dict[tuple[End, str, str, int], int | None] = field(default_factory=dict)
    #: broker groups whose probe hung this round: not asked again (every probe call runs in the claim
    #: transaction, the batch's rows locked; a hung broker cost a timeout per queue)
    unanswered: set[str] = field(default_factory=set)
    monotonic: Callable[[], float] = time.monotonic

    def broker_max(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return self._ask(End.MAX, topic, queue_id, broker_name)

    def broker_min(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        """The queue's first stored offset, asked only of a probe that tells it (``None`` otherwise)."""
        if not isinstance(self.probe, RetentionProbe):
            return None
        return self._ask(End.MIN, topic, queue_id, broker_name)

    def _ask(self, end: End, topic: str, queue_id: int, broker_name: str) -> int | None:
        key = (end, topic, broker_name, queue_id)
        if key not in self.probed:
            answer: int | None = None
            if self.probe is not None and broker_name not in self.unanswered:
                started = self.monotonic()
                try:
                    if end is End.MAX:
                        answer = self.probe.max_offset(topic, queue_id, broker_name)
                    else:
                        assert isinstance(self.probe, RetentionProbe)
                        answer = self.probe.min_offset(topic, queue_id, broker_name)
                except Exception as exc:  # the contract says None for "cannot tell"; a raising probe too
                    log.warning(
                        "broker probe (%s offset) of %s %s queue %d failed: %r",
                        end.value,
                        topic,
                        broker_name,
                        queue_id,
                        exc,
                    )
                if answer is None and self.monotonic() - started >= C.SLOW_BROKER_CALL_S:
                    self.unanswered.add(broker_name)
                    log.warning(
                        "broker probe of %s %s queue %d gave no answer in %.1f s: its queues are not probed"
                        " again this round (no loss verdict for them)",
                        topic,
                        broker_name or "(broker)",
                        queue_id,
                        self.monotonic() - started,
                    )
            self.probed[key] = answer
        return self.probed[key]


def triage(
    t: Triage,
    conn: Connection,
    claimed: Sequence[Candidate],
    read: Callable[[Sequence[Candidate]], list[LeaseView]],
    now: dt.datetime,
    marks: Watermarks,
) -> tuple[list[Candidate], BatchResult]:
    """Hold, give up and alarm inside ``conn``; return the rows to send and the counts so far. The
    watermarks read go into ``marks`` (the batch's, for the sends' backlog estimate)."""
    result = BatchResult()
    rows = load_stubs(conn, claimed)
    orphans = {(c.consumer_group, c.message_id) for c in claimed} - {
        (c.consumer_group, c.message_id) for c in rows
    }
    holds: list[tuple[Candidate, dt.datetime, str | None]] = []
    dead: list[tuple[Candidate, str]] = []
    for c in claimed:  # no body to re-send: wait for a copy already out, then tell a person
        if (c.consumer_group, c.message_id) in orphans:
            if now - c.created_at >= t.max_unconfirmed_age:
                dead.append((c, no_stub_reason(c, t.max_unconfirmed_age)))
            else:
                holds.append((c, now + t.stuck_after, NO_STUB))
    topics = {(c.consumer_group, c.message_id): copy_topic(t.sender, c) for c in rows}
    keys: set[QueueIdKey] = {
        (c.consumer_group, topics[(c.consumer_group, c.message_id)], c.queue_id)
        for c in rows
        if c.queue_id is not None and not c.stuck
    }
    queues = marks.load(conn, keys)
    leases = read(rows)
    alarms: list[tuple[Candidate, str, Facts]] = []
    send: list[Candidate] = []
    waiting = BacklogEstimator(None)  # time for the group to reach *our* offset (not the broker's end)
    positions: dict[tuple[str, str, str, int], Position] = {}  # a batch has a few queues, many rows
    verdicts: Counter[Verdict] = Counter()
    for cand, lease in zip(rows, leases, strict=True):
        topic = topics[(cand.consumer_group, cand.message_id)]
        broker = cand.broker_name
        pos = None
        if cand.queue_id is not None:
            where = (cand.consumer_group, topic, broker, cand.queue_id)
            pos = positions.get(where)
            if pos is None:
                pos = positions[where] = resolve(queues, *where)
        queue = None if pos is None else pos.progress
        watermark = queue.max_offset if queue is not None else None
        decided = cand.queue_offset is None or (watermark is not None and cand.queue_offset <= watermark)
        broker_max = broker_min = None
        # an unknown position (no broker name on a cluster with groups): no probe, so no loss verdict
        if not cand.stuck and not decided and cand.queue_id is not None and pos is not None and pos.known:
            broker_max = t.broker_max(topic, cand.queue_id, broker)
            if broker_max is not None and cand.queue_offset is not None and broker_max > cand.queue_offset:
                broker_min = t.broker_min(topic, cand.queue_id, broker)  # the broker has it, or expired it
        legacy = pos is not None and pos.consumed and queue is None
        facts = Facts(
            watermark=watermark, broker_max=broker_max, broker_min=broker_min, legacy_position=legacy
        )
        verdict = judge(
            cand,
            facts,
            now=now,
            stuck_after=t.stuck_after,
            max_unconfirmed_age=t.max_unconfirmed_age,
            retry_schedule=t.retry_schedule,
            resend_to_group_only=targets_groups(t.sender),
        )
        verdicts[verdict] += 1
        if verdict.resend and lease.blocks_resend:
            if lease.state is LeaseState.HELD:
                result.lease_held += 1
            else:
                result.lease_unknown += 1
            holds.append((cand, now + (lease.remaining or t.lease_hold), None))
        elif verdict is Verdict.QUEUED:
            result.held += 1
            assert cand.queue_id is not None
            eta = waiting.estimate(queue, topic, cand.queue_id, cand.queue_offset, broker)
            holds.append((cand, now + t.policy.delay(cand.sends) + eta, None))
        elif verdict is Verdict.BROKER_RETRY:
            result.held += 1
            assert cand.last_received_at is not None and cand.last_reconsume_times is not None
            delay = t.retry_schedule(cand.last_reconsume_times) or dt.timedelta(0)
            holds.append((cand, retry_window_end(cand.last_received_at, delay, t.stuck_after), None))
        elif verdict is Verdict.NEVER_CONSUMED:
            result.held += 1
            alarms.append((cand, topic, facts))
            group, queue_id = cand.consumer_group, cand.queue_id
            on = f" of {broker}" if broker else ""
            why = f"never consumed: group {group} has no position on {topic} queue {queue_id}{on}"
            holds.append((cand, now + t.stuck_after, why))
        elif cand.sends >= t.max_sends:
            reason = give_up_reason(cand, verdict, facts, topic, t.max_sends, t.max_unconfirmed_age)
            dead.append((cand, reason))
        else:
            send.append(cand)
    for verdict, count in verdicts.items():
        metrics.VERDICTS.labels(verdict.value).inc(count)
    postpone(conn, holds)
    result.dead = mark_dead(conn, dead, channels=t.channels, now=now)
    result.never_consumed = raise_never_consumed(conn, alarms, channels=t.channels, now=now)
    return send, result
