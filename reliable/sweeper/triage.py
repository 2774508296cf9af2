"""Sorting one claimed batch: which rows to send, which to hold, which go DEAD, which raise the alarm — with
no inbox row locked while the broker is asked.

The broker's view of a queue (its max and min offsets: the :class:`~reliable.sender.BrokerProbe`) is a
network call that can take a timeout, several a batch (one per queue). Until 2026-11-29 triage asked it in
the claim transaction, the batch's rows locked: a consumer confirming one of them (DESIGN.md §2 step 3 locks
the group's inbox row) waited for the probe, a probe timeout per round while a broker group hung (on SQLite
every writer waited: the claim holds the database's write lock). Now the batch is sorted in three steps,
each where it belongs (:meth:`reliable.sweeper.Sweeper._sweep` runs them in order):

1. :func:`observe` — **in the claim transaction**: the rows' stubs (topic, body, first send; a row whose stub
   is gone waits ``stuck_after`` at a time and goes DEAD once unconfirmed for ``max_unconfirmed_age``), the
   group's watermark on each copy's queue — ``(topic, broker_name, queue_id)``, :mod:`.queues`, one
   ``consume_progress`` statement;
2. :meth:`Triage.facts` — **after it commits, no transaction open**: the broker's max offset of each queue
   the watermark does not already decide (once per queue and round) and, where the broker still has offsets
   above the copy's, its min offset (did its retention delete the copy?); then the Redis leases of every row
   (:class:`reliable.sweeper.leases.RoundLeases`, one round trip a batch — none for a while after one
   failed; until 2026-11-29 only the stuck rows', read in the claim transaction);
3. :func:`sort` judges each row (:func:`reliable.sweeper.verdict.judge`, no I/O) and holds a resend a
   worker's lease says is being handled (:func:`reliable.sweeper.leases.defers_resend`); :func:`record` writes
   the holds (:func:`.resend.postpone`), the give-ups (:func:`.giveup.mark_dead`) and the never-consumed
   alarms **in the record transaction**, on the rows still ours only — exactly as the sends' record: a row
   confirmed (or given up, or claimed again after this claim ended) while the probe or the sends were out
   keeps its state, is not counted, gives no DEAD notice and raises no alarm. :func:`.claim.still_claimed`
   locks the batch's rows first, in the guard's order, and tells which still carry the claim.

**Why the watermark is read before the probe, in the claim transaction.** Watermarks and broker offsets only
grow. ``OVERTAKEN`` trusts two facts together — the watermark at or past the copy's offset, and no delivery
of the copy (the selection's, read in the claim) —, which are true together only when read at one moment:
the watermark is journaled with the delivery's log row, so a watermark read *later* than the selection could
count a delivery that landed meanwhile (the copy received, its handler still running) as a copy the group
skipped: a needless resend, or on a spent budget a wrong DEAD. Read in the claim, it is the selection's
moment. The broker's offsets, asked after that, are newer than the watermark: a newer max offset is only
higher, so a copy the broker holds is never found ``LOST`` (``max ≤ offset``) by it, and an older watermark
is only lower, so it can make a row look queued (held, looked at again) — never overtaken, lost or expired
when it is not. (The reverse order — broker first, watermark later — pairs a broker end older than the
watermark: a group that moved past the end the probe saw would show a position beyond the broker's own end,
and its rows' verdicts would mix two moments.) A copy the broker's retention deletes after the claim, one
the group had received meanwhile, would be re-sent as ``EXPIRED``: one duplicate, which the guard absorbs;
a row the group *confirmed* meanwhile is no longer ours and is left alone.

A row confirmed while the probe is out is still sent if its verdict says so (the check is in the record, not
before each send): the duplicate is absorbed by the guard and its send is history only — the same window a
confirmation landing during an earlier send of the batch always had.
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
from reliable.sender import BrokerProbe, RetentionProbe, SendReceipt
from reliable.stores import LeaseState
from reliable.sweeper import metrics
from reliable.sweeper.backoff import BacklogEstimator, BackoffPolicy
from reliable.sweeper.claim import still_claimed
from reliable.sweeper.giveup import NO_STUB, give_up_reason, mark_dead, no_stub_reason, raise_never_consumed
from reliable.sweeper.leases import LeaseView, defers_resend
from reliable.sweeper.queues import Position, QueueIdKey, Watermarks, consumed_topics, resolve
from reliable.sweeper.resend import BatchResult, copy_topic, postpone, targets_groups
from reliable.sweeper.selection import Candidate, load_stubs
from reliable.sweeper.verdict import Facts, RetrySchedule, Verdict, judge, retry_window_end

log = logging.getLogger("reliable.sweeper")


class End(enum.Enum):
    """Which end of a queue a probe call asks for."""

    MAX = "max"
    MIN = "min"


class Hold(enum.Enum):
    """Why a row is held back (what the round's summary counts it as)."""

    NO_STUB = "no_stub"
    LEASE_HELD = "lease_held"
    LEASE_UNKNOWN = "lease_unknown"
    QUEUED = "queued"  # queued, inside the broker's retry window, or never consumed


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
    #: (end, topic, broker_name, queue_id) → the broker's max or min offset, asked once per round
    probed: dict[tuple[End, str, str, int], int | None] = field(default_factory=dict)
    #: broker groups whose probe hung this round: not asked again (no row lock is held while one is asked,
    #: but each costs the round a timeout)
    unanswered: set[str] = field(default_factory=set)
    monotonic: Callable[[], float] = time.monotonic

    def broker_max(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return self._ask(End.MAX, topic, queue_id, broker_name)

    def broker_min(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        """The queue's first stored offset, asked only of a probe that tells it (``None`` otherwise)."""
        if not isinstance(self.probe, RetentionProbe):
            return None
        return self._ask(End.MIN, topic, queue_id, broker_name)

    def facts(self, seen: Observed) -> list[Facts]:
        """What the broker says about each observed row's queue (network calls: no transaction open)."""
        return [self._facts(row) for row in seen.rows]

    def ask_landed(self, landed: Sequence[tuple[str, SendReceipt]]) -> None:
        """Ask the max offset of the queues the batch's copies landed on (``(topic, receipt)``), for their
        backlog estimate (:meth:`known_ends`), before the record transaction opens."""
        if self.probe is None:
            return
        for topic, receipt in landed:
            self.broker_max(topic, receipt.queue_id, receipt.broker_name)

    def known_ends(self, cap_s: float) -> BacklogEstimator:
        """A backlog estimator answered from the probe calls made so far only (it calls no broker)."""
        return BacklogEstimator(_Answered(self.probed) if self.probe is not None else None, cap_s)

    def _facts(self, row: Seen) -> Facts:
        cand, pos = row.cand, row.pos
        mark = row.watermark
        decided = cand.queue_offset is None or (mark is not None and cand.queue_offset <= mark)
        broker_max = broker_min = None
        # an unknown position (no broker name on a cluster with groups): no probe, so no loss verdict
        if not cand.stuck and not decided and cand.queue_id is not None and pos is not None and pos.known:
            broker_max = self.broker_max(row.topic, cand.queue_id, cand.broker_name)
            if broker_max is not None and cand.queue_offset is not None and broker_max > cand.queue_offset:
                broker_min = self.broker_min(row.topic, cand.queue_id, cand.broker_name)  # has it, or expired
        legacy = pos is not None and pos.consumed and pos.progress is None
        # a 5.x send's queue is unknown (-1): no consumer ever has a position there
        unconsumed = pos is not None and not pos.consumed and cand.queue_id != C.UNKNOWN_QUEUE_ID
        return Facts(
            watermark=row.watermark,
            broker_max=broker_max,
            broker_min=broker_min,
            legacy_position=legacy,
            unconsumed=unconsumed or row.topic_unconsumed,
        )

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


@dataclass(frozen=True, slots=True)
class _Answered:
    """The max offsets a :class:`Triage` was told this round, as a :class:`~reliable.sender.BrokerProbe`."""

    probed: dict[tuple[End, str, str, int], int | None]

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return self.probed.get((End.MAX, topic, broker_name, queue_id))


@dataclass(frozen=True, slots=True)
class Seen:
    """One claimed row with its stub, as the claim transaction read it."""

    cand: Candidate
    #: the topic of the group's newest copy (:func:`.resend.copy_topic`)
    topic: str
    #: what the group's watermarks say about that copy's queue; ``None``: the copy has no queue
    pos: Position | None
    #: the copy's queue is unknown (a RocketMQ 5.x send) and the group has no watermark on its topic at all
    topic_unconsumed: bool = False

    @property
    def watermark(self) -> int | None:
        progress = self.pos.progress if self.pos is not None else None
        return progress.max_offset if progress is not None else None


@dataclass(frozen=True, slots=True)
class Observed:
    """What the claim transaction read about a batch: the rows with a stub, and those without."""

    rows: list[Seen]
    orphans: list[Candidate]


def observe(
    t: Triage,
    conn: Connection,
    claimed: Sequence[Candidate],
    marks: Watermarks,
) -> Observed:
    """Read, inside the claim transaction, what the verdicts need from the database: stubs and watermarks
    (into ``marks``, the batch's, also for the sends' backlog estimate)."""
    rows = load_stubs(conn, claimed)
    have = {(c.consumer_group, c.message_id) for c in rows}
    orphans = [c for c in claimed if (c.consumer_group, c.message_id) not in have]
    topics = [copy_topic(t.sender, c) for c in rows]
    keys: set[QueueIdKey] = {
        (c.consumer_group, topic, c.queue_id)
        for c, topic in zip(rows, topics, strict=True)
        if c.queue_id is not None and not c.stuck
    }
    queues = marks.load(conn, keys)
    unknown = {(g, topic) for g, topic, q in keys if q == C.UNKNOWN_QUEUE_ID}
    consumed = consumed_topics(conn, unknown)
    positions: dict[tuple[str, str, str, int], Position] = {}  # a batch has a few queues, many rows
    seen = []
    for cand, topic in zip(rows, topics, strict=True):
        pos = None
        if cand.queue_id is not None:
            where = (cand.consumer_group, topic, cand.broker_name, cand.queue_id)
            pos = positions.get(where)
            if pos is None:
                pos = positions[where] = resolve(queues, *where)
        unconsumed = (cand.consumer_group, topic) in unknown - consumed and not cand.stuck
        seen.append(Seen(cand, topic, pos, unconsumed))
    return Observed(seen, orphans)


@dataclass
class Plan:
    """One batch sorted: what to send, and what :func:`record` writes on the rows still claimed."""

    send: list[Candidate] = field(default_factory=list)
    holds: list[tuple[Candidate, dt.datetime, str | None, Hold]] = field(default_factory=list)
    dead: list[tuple[Candidate, str]] = field(default_factory=list)
    alarms: list[tuple[Candidate, str, Facts]] = field(default_factory=list)

    def rows(self) -> list[Candidate]:
        """Every row of the batch (the record locks them all, in the guard's order)."""
        return [*self.send, *(h[0] for h in self.holds), *(d[0] for d in self.dead)]


def sort(
    t: Triage, seen: Observed, facts: Sequence[Facts], leases: Sequence[LeaseView], now: dt.datetime
) -> Plan:
    """Judge each row (no I/O): send, hold, give up or alarm. ``leases``: one per row of ``seen``."""
    plan = Plan()
    for c in seen.orphans:  # no body to re-send: wait for a copy already out, then tell a person
        if now - c.created_at >= t.max_unconfirmed_age:
            plan.dead.append((c, no_stub_reason(c, t.max_unconfirmed_age)))
        else:
            plan.holds.append((c, now + t.stuck_after, NO_STUB, Hold.NO_STUB))
    waiting = BacklogEstimator(None)  # time for the group to reach *our* offset (not the broker's end)
    verdicts: Counter[Verdict] = Counter()
    patience = t.max_unconfirmed_age + t.stuck_after  # how long a lease may hold a never-received row
    for row, fact, lease in zip(seen.rows, facts, leases, strict=True):
        cand, topic = row.cand, row.topic
        verdict = judge(
            cand,
            fact,
            now=now,
            stuck_after=t.stuck_after,
            max_unconfirmed_age=t.max_unconfirmed_age,
            retry_schedule=t.retry_schedule,
            resend_to_group_only=targets_groups(t.sender),
        )
        verdicts[verdict] += 1
        if verdict.resend and defers_resend(lease, cand, now=now, patience=patience):
            kind = Hold.LEASE_HELD if lease.state is LeaseState.HELD else Hold.LEASE_UNKNOWN
            plan.holds.append((cand, now + (lease.remaining or t.lease_hold), None, kind))
        elif verdict is Verdict.QUEUED:
            assert cand.queue_id is not None and row.pos is not None
            queue, offset = row.pos.progress, cand.queue_offset
            eta = waiting.estimate(queue, topic, cand.queue_id, offset, cand.broker_name)
            plan.holds.append((cand, now + t.policy.delay(cand.sends) + eta, None, Hold.QUEUED))
        elif verdict is Verdict.BROKER_RETRY:
            assert cand.last_received_at is not None and cand.last_reconsume_times is not None
            delay = t.retry_schedule(cand.last_reconsume_times) or dt.timedelta(0)
            until = retry_window_end(cand.last_received_at, delay, t.stuck_after)
            plan.holds.append((cand, until, None, Hold.QUEUED))
        elif verdict is Verdict.NEVER_CONSUMED:
            plan.alarms.append((cand, topic, fact))
            group, queue_id, broker = cand.consumer_group, cand.queue_id, cand.broker_name
            on = f" of {broker}" if broker else ""
            where = (
                f"{topic} queue {queue_id}{on}" if queue_id != C.UNKNOWN_QUEUE_ID else f"any queue of {topic}"
            )
            why = f"never consumed: group {group} has no position on {where}"
            plan.holds.append((cand, now + t.stuck_after, why, Hold.QUEUED))
        elif cand.sends >= t.max_sends:
            reason = give_up_reason(
                cand,
                verdict,
                fact,
                topic,
                t.max_sends,
                t.max_unconfirmed_age,
                lease,
            )
            plan.dead.append((cand, reason))
        else:
            plan.send.append(cand)
    for verdict, count in verdicts.items():
        metrics.VERDICTS.labels(verdict.value).inc(count)
    return plan


def record(conn: Connection, plan: Plan, *, claimed_until: dt.datetime, now: dt.datetime) -> BatchResult:
    """Write the plan's holds, give-ups and alarms on the rows still carrying the claim (the batch's rows
    locked first, in the guard's order); the counts are of what was written.

    A batch with only sends has nothing to write here; on PostgreSQL the sends' record statement locks its
    rows in the guard's order and tests the claim itself, so nothing is locked beforehand (the lock read cost
    a quarter of a resent row's database time). Elsewhere the sends' record is an executemany in its own
    order: the lock read orders it."""
    if not (plan.holds or plan.dead or plan.alarms) and conn.dialect.name == "postgresql":
        return BatchResult()
    ours = still_claimed(conn, plan.rows(), claimed_until)

    def mine(c: Candidate) -> bool:
        return (c.consumer_group, c.message_id) in ours

    holds = [h for h in plan.holds if mine(h[0])]
    result = BatchResult()
    kinds = Counter(kind for *_, kind in holds)
    result.lease_held, result.lease_unknown = kinds[Hold.LEASE_HELD], kinds[Hold.LEASE_UNKNOWN]
    result.held = kinds[Hold.QUEUED]
    postpone(conn, [(c, until, why) for c, until, why, _ in holds], claimed_until)
    result.dead = mark_dead(conn, [d for d in plan.dead if mine(d[0])], now=now)
    alarms = [a for a in plan.alarms if mine(a[0])]
    result.never_consumed = raise_never_consumed(conn, alarms, now=now)
    return result
