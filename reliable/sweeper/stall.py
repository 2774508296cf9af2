"""The stalled-group alarm: a group that consumed a queue and then stopped must reach a person.

The resend rules cannot see it. The group's rows beyond its position are on the broker, so they are
``queued``, not lost, and re-sending them would not help: nobody of the group reads. Without this alarm the
stop shows only as lag. The sweeper checks, each round, every ``(group, topic, broker group, queue)`` whose
watermark (``consume_progress.max_offset``) has not moved for ``stall_after`` (its ``updated_at`` — the guard
writes it with every delivery it journals), and calls it **stalled** when

* the broker holds messages beyond the watermark (the probe's max offset, one past the last message, is
  above ``watermark + 1``: a quiet queue — nothing new — is not a stall; nor is a queue whose messages
  beyond the watermark the broker's retention deleted — its min offset is the max offset: the group has
  nothing to read there, and the resend rules send the expired ones again), and
* the group owes one of them: a ``PENDING`` inbox row whose copy (the producer's send) sits beyond the
  watermark on that queue and was sent ``stall_after`` ago or more (so a message that just arrived on a
  quiet queue is not one either).

A queue is ``(topic, broker_name, queue_id)`` (reliable/sweeper/queues.py): on a RocketMQ cluster queue 0
on broker-a and queue 0 on broker-b are different queues, so the probe is asked about the watermark's own
broker group and only copies on that broker group count (the same rule as the resend verdicts): a copy
without a broker name (sent before migration 0006) counts only for a watermark without one, and a watermark
without one is not checked at all once the group has rows naming broker groups on that queue id (it is the
pre-0006 row, superseded; a copy without a broker name has no known position there).

Without a probe (RabbitMQ), or when the probe cannot tell, the second condition alone decides, on any
``PENDING`` row of the group on that queue that it never received and that is ``stall_after`` old — the
age of the oldest waiting row is the evidence: a live group would have taken it. A row is on its newest
copy's queue when its targeted resend landed on the topic (RabbitMQ), else (``%RETRY%{group}``: broker_sim,
RocketMQ 4.x) on its producer's copy's, as with a probe. Where the resend landed is the inbox row's
``resend_topic`` (migration 0011); a row recorded before it has none, and the sender says where its resends
land (``resend_topic`` of :func:`check_stalls`) — a sweeper restarted with another sender misreads such
rows, never the ones recorded since. Matched with the topic's queue of a ``%RETRY%`` queue's number, a
resend called a fine queue stalled and cleared the one the group stopped on (until 2026-11-29).

A stall raises the ``reliable_sweeper_stalled_seconds`` gauge (how long the watermark has been still) and
ONE notice per ``(group, topic, broker group, queue)`` per episode: an ERROR log line and a ``STALLED``
notice (own text, :mod:`.notices`). Its ``log`` channel row, written already delivered, is the notice (each
sweeper owes it on its channels, :mod:`.owed`) and the episode: it remembers the watermark the stall was
raised at. The episode ends — gauge 0, an INFO line, its rows deleted but the ones a channel still owes —
when the queue is no longer stalled (the watermark moved, or nothing is owed there any more). A notice
still owed then is delivered anyway, saying when the stall cleared: deleting it (as before) meant a
person reading only e-mail never heard of a stall that lasted as long as the webhook was down. A later
stall is a new episode with a new notice, which replaces such a leftover. Two sweepers raising the same
stall at once: the second sees the first's episode row, or its insert meets the first's primary key; either
way it counts as raised.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    and_,
    case,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from reliable import constants as C
from reliable.models import status_literal
from reliable.sweeper import metrics
from reliable.sweeper.notices import QueueRef, Stall, parse_tag, stall_key
from reliable.sweeper.owed import told_rows
from reliable.sweeper.selection import inbox, notif, progress, stub
from reliable.sweeper.selection import log as log_t
from reliable.types import StubStatus

log = logging.getLogger("reliable.sweeper")

#: the broker's max offset of ``(topic, queue_id, broker_name)``, ``None``: cannot tell (see
#: :class:`reliable.sender.BrokerProbe`)
MaxOffset = Callable[[str, int, str], "int | None"]
#: a group's queue: the key of a stall episode
GroupQueue = tuple[str, QueueRef]
#: where a resend targeted at a group lands: ``(topic, group)`` → topic (:func:`.resend.resend_topic` of the
#: sweeper's sender)
ResendTopic = Callable[[str, str], str]


@dataclass
class StallResult:
    raised: int = 0
    #: stalls open after this check (raised now or earlier)
    open: int = 0
    cleared: int = 0


def check_stalls(
    engine: Engine,
    *,
    now: dt.datetime,
    stall_after: dt.timedelta,
    broker_max: MaxOffset | None,
    broker_min: MaxOffset | None = None,
    resend_topic: ResendTopic | None = None,
) -> StallResult:
    """Find the stalled queues, raise the new ones once, clear the ended ones (see the module doc).
    ``broker_min``: the probe's min offset, where it tells it (:class:`reliable.sender.RetentionProbe`);
    ``resend_topic``: where the sender puts a targeted resend (``None``: on the topic)."""
    cutoff = now - stall_after
    with engine.begin() as conn:
        episodes = open_episodes(conn)
        still = still_watermarks(conn, cutoff)
    # the broker is asked with no transaction open: on SQLite one holds the database's write lock, and every
    # consumer's confirmation waited for the probe (a timeout while a broker group hangs)
    ends = ask_ends(still, broker_max, broker_min)
    with engine.begin() as conn:
        found = {(s.group, s.queue): s for s in find_stalls(conn, still, ends, cutoff, resend_topic)}
    # a queue the probe could not answer for (its broker group down): no evidence either way this round —
    # an open stall whose watermark stayed stays open (clearing it re-raised it, a second notice, once the
    # broker answered again)
    unanswered = (
        {queue for queue, (top, _) in ends.items() if top is None} if broker_max is not None else set()
    )
    still_at = {(g, QueueRef(t, q, b)): m for g, t, b, q, m, _ in still}
    result = StallResult()
    for key, watermark in sorted(episodes.items()):
        stall = found.get(key)
        if stall is not None and stall.watermark == watermark:
            result.open += 1
            _gauge(stall, now)
            continue
        if stall is None and key[1] in unanswered and still_at.get(key) == watermark:
            result.open += 1
            continue
        with engine.begin() as conn:
            _clear_episode(conn, key, now)
        result.cleared += 1
        group, queue = key
        metrics.STALLED_SECONDS.labels(group, queue.topic, queue.broker_name, str(queue.queue_id)).set(0)
        log.info(
            "stall cleared: group %s %s queue %s%s (its position moved, or it owes nothing there any more)",
            group,
            queue.topic,
            queue.queue_id,
            f" of {queue.broker_name}" if queue.broker_name else "",
        )
    for key, stall in sorted(found.items()):
        if episodes.get(key) == stall.watermark:
            continue
        if _raise(engine, stall, now, stall_after):
            result.raised += 1
            metrics.STALL_ALARMS.inc()
        result.open += 1
        _gauge(stall, now)
    return result


def open_episodes(conn: Connection) -> dict[GroupQueue, int | None]:
    """The stalls raised and not cleared: ``(group, queue)`` → the watermark each was raised at."""
    rows = conn.execute(
        select(notif.c.consumer_group, notif.c.reason).where(
            notif.c.channel == C.NOTIFY_CHANNEL_LOG,
            notif.c.message_id.startswith(C.STALL_KEY_PREFIX, autoescape=True),
        )
    ).all()
    out: dict[GroupQueue, int | None] = {}
    for group, reason in rows:
        tag = parse_tag(reason)
        if tag is not None:
            out[(group, tag.queue)] = tag.watermark
    return out


#: a still watermark: (group, topic, broker_name, queue_id, max_offset, updated_at)
Still = tuple[str, str, str, int, int, dt.datetime]
#: the broker's (max offset, min offset) of a queue; ``None``: not asked, or it cannot tell
Ends = dict[QueueRef, tuple[int | None, int | None]]


def still_watermarks(conn: Connection, cutoff: dt.datetime) -> list[Still]:
    """The watermarks that have not moved since ``cutoff`` (one statement)."""
    named = progress.alias("named")
    # a watermark without a broker group where the group has rows naming one: the pre-0006 row, superseded
    superseded = exists().where(
        named.c.consumer_group == progress.c.consumer_group,
        named.c.topic == progress.c.topic,
        named.c.queue_id == progress.c.queue_id,
        named.c.broker_name != "",
    )
    rows = conn.execute(
        select(
            progress.c.consumer_group,
            progress.c.topic,
            progress.c.broker_name,
            progress.c.queue_id,
            progress.c.max_offset,
            progress.c.updated_at,
        ).where(progress.c.updated_at <= cutoff, or_(progress.c.broker_name != "", ~superseded))
    ).all()
    return [(g, t, b, q, m, u) for g, t, b, q, m, u in rows]


def ask_ends(still: Sequence[Still], broker_max: MaxOffset | None, broker_min: MaxOffset | None) -> Ends:
    """The broker's ends of each still watermark's queue, a call per queue (network: no transaction open);
    the min offset only where the broker holds messages beyond a watermark there."""
    lowest: dict[QueueRef, int] = {}
    for _, topic, broker_name, queue_id, watermark, _ in still:
        queue = QueueRef(topic, queue_id, broker_name)
        lowest[queue] = min(watermark, lowest.get(queue, watermark))
    ends: Ends = {}
    for queue, watermark in lowest.items():
        top = _ask(broker_max, queue)
        beyond = top is not None and top > watermark + 1
        ends[queue] = (top, _ask(broker_min, queue) if beyond else None)
    return ends


def find_stalls(
    conn: Connection,
    still: Sequence[Still],
    ends: Ends,
    cutoff: dt.datetime,
    resend_topic: ResendTopic | None = None,
) -> list[Stall]:
    """Every stalled ``(group, topic, broker group, queue)`` among the ``still`` watermarks, by the broker's
    ``ends`` (:func:`ask_ends`) and where targeted resends land (``resend_topic``; ``None``: on the topic):
    at most one bounded lookup per still one."""
    stalls = []
    for group, topic, broker_name, queue_id, watermark, since in still:
        queue = QueueRef(topic, queue_id, broker_name)
        top, bottom = ends.get(queue, (None, None))
        if top is not None and top <= watermark + 1:
            continue  # nothing beyond the watermark: a quiet queue
        readable_from = watermark + 1
        if top is not None and bottom is not None and bottom > readable_from:
            readable_from = bottom  # the retention deleted the rest: those are the resend rules' now
        probed, here = top is not None, resend_topic is None or resend_topic(topic, group) == topic
        owed = _owed(conn, group, queue, watermark, readable_from, cutoff, probed=probed, resends_here=here)
        if owed is not None:
            stalls.append(Stall(group, queue, watermark, since, top, readable_from, owed[0], owed[1]))
    return stalls


def _ask(broker_max: MaxOffset | None, queue: QueueRef) -> int | None:
    if broker_max is None or queue.queue_id is None:
        return None
    try:
        return broker_max(queue.topic, queue.queue_id, queue.broker_name)
    except Exception as exc:  # the contract says None for "cannot tell"; a raising probe too
        log.warning(
            "broker probe of %s %s queue %s failed: %r", queue.topic, queue.broker_name, queue.queue_id, exc
        )
        return None


def _owed(
    conn: Connection,
    group: str,
    queue: QueueRef,
    watermark: int,
    readable_from: int,
    cutoff: dt.datetime,
    *,
    probed: bool,
    resends_here: bool = True,
) -> tuple[str, dt.datetime] | None:
    """The first message ``group`` owes on ``queue`` that proves the stall, and since when; ``None``: none.

    With a probe: a producer's copy the broker still holds beyond the watermark (from ``readable_from``),
    sent ``stall_after`` ago — or, where the broker's retention deleted copies beyond the watermark
    (``readable_from`` above ``watermark + 1``), one of those that the sweeper re-sent to the group
    (``EXPIRED``) ``stall_after`` ago and the group has not taken either. A group that came back reads its
    resends at once and owes nothing; one still stopped keeps its stall open (the resends' retry topic has no
    stall watch of its own).

    Without one: a row never received, ``stall_after`` old, on ``queue`` — its newest copy's where the group's
    resends land on the topic (``resends_here``), else its producer's copy's (see the module doc)."""
    mine = and_(
        inbox.c.message_id == stub.c.message_id,
        inbox.c.consumer_group == group,
        inbox.c.status == status_literal(StubStatus.PENDING),  # may walk the partial status index
        stub.c.topic == queue.topic,
    )
    if probed:
        # the producer's copy, beyond the watermark, sent long enough ago: lowest offset = first owed
        sent = func.coalesce(stub.c.last_sent_at, inbox.c.created_at)
        owed = and_(inbox.c.queue_offset.is_(None), stub.c.queue_offset >= readable_from, sent <= cutoff)
        since: ColumnElement[dt.datetime] = sent
        if readable_from > watermark + 1:  # deleted by retention, re-sent to the group, not taken either
            resent = and_(
                inbox.c.queue_offset.is_not(None),
                stub.c.queue_offset > watermark,
                stub.c.queue_offset < readable_from,
                inbox.c.updated_at <= cutoff,  # the group's last (targeted) send
            )
            owed = or_(owed, resent)
            since = case((inbox.c.queue_offset.is_(None), sent), else_=inbox.c.updated_at)
        q = (
            select(inbox.c.message_id, since)
            .where(mine, stub.c.broker_name == queue.broker_name, stub.c.queue_id == queue.queue_id, owed)
            .order_by(stub.c.queue_offset)
        )
    else:
        received = exists().where(
            log_t.c.message_id == inbox.c.message_id, log_t.c.consumer_group == inbox.c.consumer_group
        )
        queue_id: ColumnElement[int | None] = stub.c.queue_id
        broker: ColumnElement[str] = stub.c.broker_name
        # the newest copy's queue: the targeted resend's (on the inbox row) where it landed on the topic —
        # as recorded, or, recorded before migration 0011, as the sender says (``resends_here``); else the
        # producer's (the resend's queue id is of the group's retry topic)
        recorded_here = inbox.c.resend_topic == stub.c.topic
        here = or_(recorded_here, inbox.c.resend_topic.is_(None)) if resends_here else recorded_here
        resent_here = and_(inbox.c.queue_id.is_not(None), here)
        queue_id = case((resent_here, inbox.c.queue_id), else_=stub.c.queue_id)
        broker = case((resent_here, inbox.c.broker_name), else_=stub.c.broker_name)
        offset = case((resent_here, inbox.c.queue_offset), else_=stub.c.queue_offset)
        q = (
            select(inbox.c.message_id, inbox.c.created_at)
            .where(
                mine,
                queue_id == queue.queue_id,
                broker == queue.broker_name,
                inbox.c.created_at <= cutoff,
                ~received,
            )
            # the first owed on the queue, as with a probe (unordered, the notice named any of them, which
            # one changing with the plan: "stays at 509 … owes m511" sent a person looking for 510)
            .order_by(offset, inbox.c.message_id)
        )
    row = conn.execute(q.limit(1)).first()
    return None if row is None else (str(row[0]), row[1])


def _raise(engine: Engine, stall: Stall, now: dt.datetime, stall_after: dt.timedelta) -> bool:
    """Tell the notice, which is the episode; ``False`` when another sweeper raised it first."""
    reason = stall.reason(stall_after)
    key = [(stall_key(stall.queue), stall.group)]
    rows = told_rows(key, [reason], now)  # the log row is the notice and the episode
    try:
        with engine.begin() as conn:
            if (stall.group, stall.queue) in open_episodes(conn):
                return False  # another sweeper raised it since this one looked
            # rows of the key without an episode row are leftovers: a cleared episode's notice still owed
            # (this one tells the queue's news since) or one a person deleted the episode row of
            _delete_episode(conn, (stall.group, stall.queue))
            conn.execute(insert(notif), rows)
    except IntegrityError:  # both looked at once: the other insert won
        log.info("stall of %s on %s already raised by another sweeper", stall.group, stall.queue)
        return False
    log.error("stalled-group alarm: %s", reason)
    return True


def _delete_episode(conn: Connection, key: GroupQueue) -> None:
    group, queue = key
    conn.execute(delete(notif).where(notif.c.message_id == stall_key(queue), notif.c.consumer_group == group))


def _clear_episode(conn: Connection, key: GroupQueue, now: dt.datetime) -> None:
    """End the episode: its rows go, but the ones a channel still owes, which say when it cleared."""
    group, queue = key
    mine = and_(notif.c.message_id == stall_key(queue), notif.c.consumer_group == group)
    cleared = f" Cleared at {now.isoformat()}: the group's position moved, or it owes nothing there any more."
    conn.execute(
        update(notif).where(mine, notif.c.notified_at.is_(None)).values(reason=notif.c.reason + cleared)
    )
    conn.execute(delete(notif).where(mine, notif.c.notified_at.is_not(None)))


def _gauge(stall: Stall, now: dt.datetime) -> None:
    seconds = max((now - stall.still_since).total_seconds(), 0.0)
    q = stall.queue
    metrics.STALLED_SECONDS.labels(stall.group, q.topic, q.broker_name, str(q.queue_id)).set(seconds)
