"""Re-sending claimed inbox rows through the producer's :class:`reliable.sender.Sender`.

Every resend is *targeted* (``OutgoingMessage.target_group`` = the row's group): RocketMQ and broker_sim
send it to ``%RETRY%{group}`` with ``RETRY_TOPIC`` = the topic, RabbitMQ to the group's queue, a sender that
cannot target (``targets_groups = False``: Kafka, RocketMQ 5.x) to the topic — the other groups' guards absorb
the duplicate, and the rows of one message due for several groups in one round share one copy. Sending and
recording are :func:`reliable.outbox.attempt_send` and :func:`reliable.outbox.record_sends` (one owner of
send-and-record, shared with the producer); this module decides what to send and when it is due again.
Where the copy landed is the group's own history, recorded on its inbox row (the stub keeps the topic-wide
send)::

    resend_count  += 1
    resend_topic                                where the sender put it (:func:`resend_topic`; migration 0011)
    broker_name, queue_id, queue_offset         the receipt's (the next round compares the offset with the
                                                 group's watermark on that queue of :func:`copy_topic`, and
                                                 the broker's)
    resend_at      = now + backoff(sends) + backlog estimate
    attempts       = 0                          (a fresh copy: the guard counts its failures anew)
    last_error     = NULL

A failed send (the sender raised — any exception means "not accepted", see reliable/sender.py) counts as a
send too: ``resend_count += 1``, ``last_error`` = the reason, ``resend_at = now + backoff(sends)``, and the
position keeps describing the last copy that did land. Counting failures keeps a permanently broken route
(unknown topic, revoked credentials) from retrying forever in silence: it spends the budget and ends DEAD,
which tells a person.

The status is never changed here: a consumer may confirm the row while the broker call is in flight (no row
lock is held during it: :mod:`.claim`), and that confirmation must stand — the record writes the due time and
error only on rows still ``PENDING`` and still carrying the claim. :func:`postpone` is the sweeper's only
other write: it moves ``resend_at`` of rows it holds back (queued, leased, inside the broker's retry window,
never consumed).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, and_, bindparam, func, update

from reliable import constants as C
from reliable import outbox
from reliable.otel.propagation import carrier_from_json
from reliable.sender import OutgoingMessage, Sender, SendReceipt
from reliable.staged import stored_properties
from reliable.sweeper.backoff import BacklogEstimator, BackoffPolicy
from reliable.sweeper.notices import DeadNotice
from reliable.sweeper.queues import Watermarks
from reliable.sweeper.selection import Candidate, inbox
from reliable.types import StubStatus

log = logging.getLogger("reliable.sweeper")

#: a property on every resent copy, so a consumer (or a person reading the broker) can tell it is a resend.
RESEND_PROPERTY = "RELIABLE_RESEND"


class OutagePause:
    """Which of a round's sends should stop because their broker (or their route) looks down.

    Every failed resend spends one of the row's ``max_sends`` (and, before claims moved to a claim window,
    every send held the batch's rows locked — consumers confirming one of them waited). A broker that hung
    (each send waiting for the sender's timeout) or refuses everything (a name server down) made one round
    spend a unit of every due row's budget — a quarter of an hour of maintenance ended every message staged
    meanwhile DEAD — and held the batch's locks for a timeout per row (minutes). So:

    * after ``SWEEP_PAUSE_AFTER_SLOW_FAILURES`` failures in a row that each took
      ``SLOW_BROKER_CALL_S`` or longer (a hung broker) the round sends nothing more (``paused``);
    * after ``SWEEP_PAUSE_AFTER_FAILURES`` failures in a row on one route — the topic the copy goes to, or the
      group's own queue where each group's copy goes to one (RabbitMQ, :func:`pause_route`) — the round
      sends nothing more there (``route_paused``): a name server down refuses every route, each then spends
      three rows' budget a round, not every row's; a deleted topic, a misrouted queue or a full queue
      refusing publishes stops only its own rows, and the healthy routes behind it are sent in the same round.

    Rows not sent stay due, budget untouched (the next round, or later rounds, try them). A landed send resets
    its route's count (and the slow count): a broken route of one message among healthy ones still spends
    its own budget and ends DEAD, which tells a person. Counted over the round's batches.
    """

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.monotonic = monotonic
        self.slow_failures = 0
        self.route_failures: dict[str, int] = {}

    def record(self, route: str, started: float, ok: bool) -> None:
        if ok:
            self.slow_failures = 0
            self.route_failures[route] = 0
            return
        self.route_failures[route] = self.route_failures.get(route, 0) + 1
        slow = self.monotonic() - started >= C.SLOW_BROKER_CALL_S
        self.slow_failures = self.slow_failures + 1 if slow else 0

    @property
    def paused(self) -> bool:
        return self.slow_failures >= C.SWEEP_PAUSE_AFTER_SLOW_FAILURES

    def route_paused(self, route: str) -> bool:
        return self.route_failures.get(route, 0) >= C.SWEEP_PAUSE_AFTER_FAILURES


@dataclass
class BatchResult:
    resent: int = 0
    send_failures: int = 0
    stuck_recovered: int = 0
    lease_held: int = 0  # stuck rows left alone: a live worker holds the lease
    lease_unknown: int = 0  # stuck rows postponed: Redis did not answer
    held: int = 0  # rows found queued, inside the broker's retry window, or never consumed
    never_consumed: int = 0
    dead: list[DeadNotice] = field(default_factory=list)
    #: the batch stopped sending: the broker looks down (:class:`OutagePause`); the round ends
    paused: bool = False
    #: rows not sent because their route refused the round's last sends there (postponed to the next round)
    route_paused: int = 0


def copy_topic(sender: object, cand: Candidate) -> str:
    """The topic of the group's newest copy: the stub's topic, or where its targeted resend went — as the
    inbox row recorded it, else (recorded before migration 0011) where ``sender`` puts one."""
    if not cand.targeted:
        return cand.topic
    if cand.inbox_topic is not None:
        return cand.inbox_topic
    return resend_topic(sender, cand.topic, cand.consumer_group)


def pause_route(sender: object, topic: str, group: str, sent_to: str) -> str:
    """What :class:`OutagePause` counts refusals by for a resend targeted at ``group``: the sender's
    ``resend_route(topic, group)`` where it sends each group's copy somewhere of its own (RabbitMQ: the
    group's queue), else ``sent_to``, the topic the copy goes to (:func:`resend_topic`).

    Why not always the topic: a RabbitMQ resend lands in the group's own queue, and a queue that refuses it
    (full, ``x-overflow reject-publish``) refuses only its group's copies. Counted by topic, three refusals
    from one slow group's full queue paused the topic for the round, and the other groups' resends of it
    (a fast group's lost message) waited behind every due row of the slow group, three a round."""
    route = getattr(sender, "resend_route", None)
    return str(route(topic, group)) if callable(route) else sent_to


def resend_topic(sender: object, topic: str, group: str) -> str:
    """Where ``sender`` puts a resend targeted at ``group`` (its ``resend_topic(topic, group)``, if it has
    one: ``%RETRY%{group}`` for RocketMQ and broker_sim); a sender without it sends to the topic."""
    route = getattr(sender, "resend_topic", None)
    return str(route(topic, group)) if callable(route) else topic


#: where rows of a paused route are postponed to: past the round's selection time, so the next round
_NEXT_ROUND = dt.timedelta(seconds=1)
_ROUTE_PAUSED = "not sent this round: its route refused the round's last sends there"


def targets_groups(sender: object) -> bool:
    """Whether ``sender`` can address one consumer group (its ``targets_groups``; absent: it can)."""
    return bool(getattr(sender, "targets_groups", True))


@dataclass
class Sent:
    """What one batch's sends did, before any of it is recorded."""

    result: BatchResult
    #: each tried row with its attempt (a shared copy counts for each of its rows)
    attempts: list[tuple[Candidate, outbox.SendAttempt]] = field(default_factory=list)
    #: rows of a route that refused the round's last sends there: postponed to the next round
    skipped: list[Candidate] = field(default_factory=list)
    #: claimed, not tried: a stop, an outage pause, the claim's last fifth
    unsent: Sequence[Candidate] = ()
    #: (group, message_id) → the topic the row's copy goes to
    routes: dict[tuple[str, str], str] = field(default_factory=dict)

    def landed(self) -> list[tuple[str, SendReceipt]]:
        """Where the landed copies are: ``(topic, receipt)``."""
        return [
            (self.routes[(c.consumer_group, c.message_id)], a.receipt)
            for c, a in self.attempts
            if a.receipt is not None
        ]


def send_batch(
    sender: Sender,
    candidates: Sequence[Candidate],
    *,
    should_stop: Callable[[], bool] = lambda: False,
    outage: OutagePause | None = None,
    copies: dict[str, outbox.SendAttempt] | None = None,
) -> Sent:
    """Send each row's targeted copy, with no transaction open (:func:`record_batch` records them).

    A stop request between sends leaves the rest unsent, their budget untouched. So does a broker that looks
    down (``outage``, the round's :class:`OutagePause`): the batch's sends stop and ``result.paused`` is set;
    a route that looks down is skipped, its rows postponed to the next round (``result.route_paused``).
    ``copies``: the round's copies sent so far by message id, for a sender that cannot target one group (a
    message's due rows may fall into two batches of a round: one copy still serves both).
    """
    outage = outage if outage is not None else OutagePause()
    monotonic = outage.monotonic
    routes = {
        (c.consumer_group, c.message_id): resend_topic(sender, c.topic, c.consumer_group) for c in candidates
    }
    done = Sent(BatchResult(), routes=routes)
    # a sender that cannot address one group puts every targeted copy on the topic, where all groups get it:
    # one copy per message per round then serves each due group of it (N due groups sent N copies each)
    one_copy = not targets_groups(sender)
    copies = copies if copies is not None else {}
    for at, cand in enumerate(candidates):
        if should_stop():
            done.unsent = candidates[at:]
            break
        if outage.paused:
            done.result.paused = True
            done.unsent = candidates[at:]
            break
        topic = routes[(cand.consumer_group, cand.message_id)]
        route = pause_route(sender, cand.topic, cand.consumer_group, topic)
        if outage.route_paused(route):
            done.skipped.append(cand)
            continue
        message = OutgoingMessage(
            message_id=cand.message_id,
            topic=cand.topic,
            body=cand.content,
            tags=cand.tags,
            send_count=cand.sends,
            properties={
                **stored_properties(cand.properties),
                **carrier_from_json(cand.trace_context),
                RESEND_PROPERTY: str(cand.sends),
            },
            target_group=cand.consumer_group,
        )
        shared = copies.get(cand.message_id) if one_copy else None
        if shared is not None:  # the copy sent for another group of this message: this group's too
            copy = outbox.SendAttempt(message, receipt=shared.receipt, error=shared.error, topic=shared.topic)
            done.attempts.append((cand, copy))
            continue
        started = monotonic()
        attempt = copies[cand.message_id] = outbox.attempt_send(sender, message, topic=topic)
        outage.record(route, started, attempt.ok)
        if outage.route_failures.get(route) == C.SWEEP_PAUSE_AFTER_FAILURES:
            log.warning(
                "%d resends to %s failed in a row (last: %s): its other due rows wait for the next round",
                C.SWEEP_PAUSE_AFTER_FAILURES,
                route,
                attempt.error,
            )
        done.attempts.append((cand, attempt))
    return done


def record_batch(
    conn: Connection,
    done: Sent,
    *,
    policy: BackoffPolicy,
    estimator: BacklogEstimator,
    now: dt.datetime,
    marks: Watermarks,
    claimed_until: dt.datetime | None = None,
) -> BatchResult:
    """Record the outcomes of :func:`send_batch` on ``conn`` (the record transaction; through
    :mod:`reliable.outbox`, the one owner of send-and-record). ``claimed_until``: the ``resend_at`` the claim
    gave the rows; only a row still ``PENDING`` and carrying it takes the outcome's due time and error (a
    confirmation that landed during the send stands: :func:`reliable.outbox.record_sends`); the rows left
    unsent are released (due again from the next round on, a second after the record). ``estimator`` must not
    call the broker (:meth:`reliable.sweeper.triage.Triage.known_ends`): ``conn`` holds row locks."""
    result = done.result
    routes = done.routes
    if done.skipped:  # not this round again: the round's later batches would select them once more
        result.route_paused += len(done.skipped)
        postpone(conn, [(c, now + _NEXT_ROUND, _ROUTE_PAUSED) for c in done.skipped], claimed_until)
    if done.unsent and claimed_until is not None:  # the claim released: due again from the next round on
        postpone(conn, [(c, now + _NEXT_ROUND, None) for c in done.unsent], claimed_until)
    keys = {
        (c.consumer_group, routes[(c.consumer_group, c.message_id)], a.receipt.queue_id)
        for c, a in done.attempts
        if a.receipt is not None
    }
    queues = marks.load(conn, keys)
    due: list[tuple[outbox.SendAttempt, dt.datetime]] = []
    for cand, attempt in done.attempts:
        sends = cand.sends + 1
        if attempt.receipt is None:
            result.send_failures += 1
            due.append((attempt, now + policy.delay(sends)))
            continue
        result.resent += 1
        if cand.stuck:
            result.stuck_recovered += 1
        topic, receipt = routes[(cand.consumer_group, cand.message_id)], attempt.receipt
        backlog = estimator.estimate(
            queues.get((cand.consumer_group, topic, receipt.broker_name, receipt.queue_id)),
            topic,
            receipt.queue_id,
            receipt.queue_offset,
            receipt.broker_name,
        )
        due.append((attempt, now + policy.delay(sends) + backlog))
    outbox.record_sends(conn, due, now, claimed_until=claimed_until)
    return result


_KEY = and_(inbox.c.consumer_group == bindparam("b_group"), inbox.c.message_id == bindparam("b_id"))


def postpone(
    conn: Connection,
    holds: Sequence[tuple[Candidate, dt.datetime, str | None]],
    claimed_until: dt.datetime | None = None,
) -> None:
    """Move ``resend_at`` of rows that must not be sent now (queued, leased, in the broker's retry window,
    never consumed); ``last_error`` says why when given. ``updated_at`` is kept: it dates the last send.
    ``claimed_until``: only rows still ``PENDING`` and carrying that claim (written after the claim's
    transaction committed: a row confirmed since keeps its state)."""
    if not holds:
        return
    where = _KEY
    if claimed_until is not None:
        where = and_(_KEY, inbox.c.status == StubStatus.PENDING, inbox.c.resend_at == claimed_until)
    conn.execute(
        update(inbox)
        .where(where)
        .values(
            resend_at=bindparam("b_resend_at", type_=inbox.c.resend_at.type),
            last_error=func.coalesce(bindparam("b_error", type_=inbox.c.last_error.type), inbox.c.last_error),
            updated_at=inbox.c.updated_at,
        ),
        [
            {"b_group": c.consumer_group, "b_id": c.message_id, "b_resend_at": until, "b_error": why}
            for c, until, why in holds
        ],
    )
