"""What a notice to a person says: one kind per cause, each with its own text, subject and webhook event.

Four causes reach a person through the same owed-notice table (``stub_notification``) and channels:

* ``DEAD`` — the sweeper gave up on a group's row (budget spent): fix, then ``reliable stubs revive``;
* ``NEVER_CONSUMED`` — a group has messages on a queue it has never consumed (wrong subscription, consumer
  never started, or started from the queue's end after them): no resend until ``max_unconfirmed_age``;
* ``STALLED`` — a group consumed a queue and stopped (consumers crashed, undeployed): its position has not
  moved for ``stall_after`` while the broker holds messages beyond it that the group owes;
* ``REDIS_UNREADABLE`` — the sweepers' reads of the guard's Redis leases have failed for longer than
  ``stuck_after`` (:mod:`.redis_outage`): stuck rows wait, the guard runs on the database alone.

The two queue-level kinds name their queue in a tag at the start of the reason (``STALLED topic=orders
broker=broker-b queue=3 watermark=41: …``) — how a person, the dedupe and the delivery recognise them; one
builder (:func:`queue_tag`) and one parser (:func:`parse_tag`) for both kinds. The table is keyed by
message; a stall notice is about a queue, so its rows use a key of their own in the ``message_id`` column
(:func:`stall_key`). A queue's identity is :class:`QueueRef` — ``(topic, broker_name, queue_id)``, the
broker group being part of it on a RocketMQ cluster (reliable/sweeper/queues.py). Without a broker group
(``''``: Kafka, RabbitMQ, one broker, or written before migration 0006) the tag has no ``broker=`` part and
the key is the one of before, so an alarm raised before the broker group joined is still recognised.
A Redis outage concerns no queue and no group: its rows have a key of their own (``C.REDIS_OUTAGE_KEY``,
group ``''``) and its reason starts with the outage's start (:func:`redis_reason`, :func:`parse_redis`).
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from reliable import constants as C


class NoticeKind(enum.Enum):
    DEAD = "dead"
    NEVER_CONSUMED = "never_consumed"
    STALLED = "stalled"
    REDIS_UNREADABLE = "redis_unreadable"


#: first word of a queue-level notice's reason, per kind
NEVER_CONSUMED_TAG = "NEVER_CONSUMED"
STALLED_TAG = "STALLED"
_TAGS = {NEVER_CONSUMED_TAG: NoticeKind.NEVER_CONSUMED, STALLED_TAG: NoticeKind.STALLED}
#: the tags of the queue-level notices (a give-up's reason has none)
QUEUE_TAGS = tuple(_TAGS)
_TAG_RE = re.compile(
    r"^(NEVER_CONSUMED|STALLED) topic=(\S+)(?: broker=(\S+))? queue=(-?\d+|None)(?: watermark=(-?\d+))?[:\s]"
)


class RedisPhase(enum.Enum):
    """A Redis outage episode's row: ``WATCHING`` (reads failing, not yet for ``stuck_after``: kept, told to
    nobody) or ``TOLD`` (the notice, owed on every channel)."""

    WATCHING = "REDIS_WATCH"
    TOLD = "REDIS_UNREADABLE"


_REDIS_RE = re.compile(r"^(REDIS_WATCH|REDIS_UNREADABLE) since=(\S+): ")


def redis_reason(phase: RedisPhase, since: dt.datetime, text: str) -> str:
    """``REDIS_UNREADABLE since=2026-11-21T12:00:00+00:00: …`` — an outage row's reason, its start first."""
    return f"{phase.value} since={since.astimezone(dt.UTC).isoformat()}: {text}"


def parse_redis(reason: str) -> tuple[RedisPhase, dt.datetime | None] | None:
    """The phase and start an outage row's reason says (start ``None``: unreadable); ``None``: not one."""
    m = _REDIS_RE.match(reason)
    if m is None:
        return None
    try:
        since = dt.datetime.fromisoformat(m.group(2))
    except ValueError:
        return RedisPhase(m.group(1)), None
    return RedisPhase(m.group(1)), since if since.tzinfo is not None else since.replace(tzinfo=dt.UTC)


@dataclass(frozen=True, slots=True, order=True)
class QueueRef:
    """One queue of a topic, as the sweeper's per-queue state is keyed: ``(topic, broker_name, queue_id)``."""

    topic: str
    queue_id: int | None
    #: the RocketMQ broker group (brokerName); ``''``: none, or not known (written before migration 0006)
    broker_name: str = ""


@dataclass(frozen=True, slots=True)
class QueueTag:
    """What a queue-level reason's tag says."""

    kind: NoticeKind
    queue: QueueRef
    #: the group's watermark when a stall was raised (``None`` for never-consumed)
    watermark: int | None


def queue_tag(tag: str, queue: QueueRef, watermark: int | None = None) -> str:
    """``STALLED topic=orders broker=broker-b queue=3 watermark=41:`` — the start of a queue-level reason
    (no ``broker=`` part without a broker group: the form of before migration 0006)."""
    broker = f" broker={queue.broker_name}" if queue.broker_name else ""
    mark = f" watermark={watermark}" if watermark is not None else ""
    return f"{tag} topic={queue.topic}{broker} queue={queue.queue_id}{mark}:"


def parse_tag(reason: str) -> QueueTag | None:
    """The tag at the start of ``reason``; ``None`` for a DEAD reason (no tag)."""
    m = _TAG_RE.match(reason)
    if m is None:
        return None
    queue_id = None if m.group(4) == "None" else int(m.group(4))
    watermark = int(m.group(5)) if m.group(5) is not None else None
    return QueueTag(_TAGS[m.group(1)], QueueRef(m.group(2), queue_id, m.group(3) or ""), watermark)


def stall_key(queue: QueueRef) -> str:
    """The ``message_id`` of a stall's notice rows: ``~stall:`` + a SHA-256 digest of the queue (cut to the
    column), so no real message id meets it short of being chosen to, whatever the topic's length. Without a
    broker group the digest is the one of before the broker group joined the queue's identity."""
    return (C.STALL_KEY_PREFIX + _digest(queue))[: C.MESSAGE_ID_MAX]


def never_consumed_marker(queue: QueueRef) -> str:
    """The ``message_id`` of a never-consumed alarm's rows (``~never:`` + the queue's digest): its primary
    key is what lets only one of two sweepers raise the alarm, and the alarm's own key (a waiting message's,
    as before migration 0010, went with that message's give-up)."""
    return (C.NEVER_CONSUMED_KEY_PREFIX + _digest(queue))[: C.MESSAGE_ID_MAX]


def _digest(queue: QueueRef) -> str:
    broker = f"\n{queue.broker_name}" if queue.broker_name else ""
    return hashlib.sha256(f"{queue.topic}\n{queue.queue_id}{broker}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class DeadNotice:
    """What a person needs to find and fix one cause (the name is historical: every kind uses it).

    For a queue-level kind ``message_id`` is the notice's key (``~stall:…``, ``~never:…``; the reason names an
    example message), ``send_count`` is 0, ``queue_offset`` is the group's watermark (a stall), and
    ``dead_at`` is when the notice was raised. A Redis outage's has no topic, group or queue (``''``,
    ``None``): its reason says since when.
    """

    message_id: str
    topic: str
    consumer_group: str
    send_count: int
    queue_id: int | None
    queue_offset: int | None
    reason: str
    dead_at: str  # ISO-8601 UTC
    kind: NoticeKind = NoticeKind.DEAD
    #: the RocketMQ broker group of the queue (``(topic, broker_name, queue_id)``): for DEAD the group's
    #: newest copy's; ``''``: no broker groups (Kafka, RabbitMQ, one broker), or sent before migration 0006
    broker_name: str = ""


#: the generic name
Notice = DeadNotice

_EVENTS = {
    NoticeKind.DEAD: "reliable.stub.dead",
    NoticeKind.NEVER_CONSUMED: "reliable.queue.never_consumed",
    NoticeKind.STALLED: "reliable.group.stalled",
    NoticeKind.REDIS_UNREADABLE: "reliable.redis.unreadable",
}


def event_name(kind: NoticeKind) -> str:
    """The webhook's ``event`` for notices of ``kind``."""
    return _EVENTS[kind]


def subject(kind: NoticeKind, notices: Sequence[DeadNotice]) -> str:
    n = len(notices)
    if kind is NoticeKind.DEAD:
        return f"[reliable] {n} message stub(s) DEAD"
    groups = ", ".join(sorted({x.consumer_group for x in notices}))
    if kind is NoticeKind.NEVER_CONSUMED:
        return f"[reliable] {n} queue(s) never consumed by group(s) {groups}"
    if kind is NoticeKind.REDIS_UNREADABLE:
        return "[reliable] the sweeper cannot read Redis (the consumer guard's leases)"
    return f"[reliable] group(s) {groups} stopped consuming {n} queue(s)"


_HEADS = {
    NoticeKind.DEAD: [
        "{n} message stub(s) went DEAD: each reason below says why (the resend sweeper gave up on it, or",
        "its group's handler failed at every attempt and the guard dead-lettered it).",
        "Fix the cause, then put them back with: reliable stubs revive ID ...",
    ],
    NoticeKind.NEVER_CONSUMED: [
        "{n} queue(s) hold messages for a consumer group that has never consumed there.",
        "Either the group is not subscribed (or its consumers never started): subscribe it, start them, and",
        "the messages waiting on the broker are delivered. Or it started after them from the queue's end",
        "(CONSUME_FROM_LAST_OFFSET, an offset reset): the broker will not deliver them; where a resend",
        "can reach that group alone the sweeper sends each once older than max_unconfirmed_age (on a shared",
        "topic, Kafka or RocketMQ 5.x: reset the group's offset to before them). Nothing is lost meanwhile.",
    ],
    NoticeKind.STALLED: [
        "{n} queue(s) stopped being consumed: the group's position there has not moved for the stall",
        "time, while the broker holds messages beyond it that the group still owes.",
        "Check the group's consumers (crashed, undeployed, a handler hanging, a lost subscription).",
        "The messages wait on the broker and are delivered when the group resumes; the alarm clears",
        "by itself once its position moves, and a later stall is reported again.",
    ],
    NoticeKind.REDIS_UNREADABLE: [
        "The resend sweeper has not been able to read the consumer guard's Redis for longer than",
        "stuck_after. Meanwhile stuck messages wait (until max_unconfirmed_age + stuck_after old) and the",
        "consumers' guard decides on the database alone: still exactly once, slower. Restore Redis (the",
        "server, the network, the --redis URL or its password); the outage ends by itself at the first",
        "read that answers, and a later outage is reported again.",
    ],
}


def _broker(x: DeadNotice) -> str:
    """`` broker=broker-b`` — the broker group, as every notice text names it (nothing without one)."""
    return f" broker={x.broker_name}" if x.broker_name else ""


def dead_line(x: DeadNotice) -> str:
    """The always-on log line of a DEAD notice (its message id, queue and reason, all on one line)."""
    return (
        f"stub DEAD message_id={x.message_id} topic={x.topic}{_broker(x)} group={x.consumer_group} "
        f"sends={x.send_count} queue={x.queue_id} offset={x.queue_offset} reason={x.reason}"
    )


def body(kind: NoticeKind, notices: Sequence[DeadNotice]) -> str:
    """The plain text of a message about ``notices`` (all of ``kind``)."""
    lines = [line.format(n=len(notices)) for line in _HEADS[kind]] + [""]
    for x in notices:
        if kind is NoticeKind.DEAD:
            where = (
                f"queue {x.queue_id} offset {x.queue_offset}" if x.queue_offset is not None else "no offset"
            )
            lines.append(
                f"- {x.message_id}  topic={x.topic}{_broker(x)} group={x.consumer_group} sends={x.send_count}"
                f" {where}  dead_at={x.dead_at}\n  reason: {x.reason}"
            )
        elif kind is NoticeKind.REDIS_UNREADABLE:
            lines.append(f"- raised_at={x.dead_at}\n  {x.reason}")
        else:
            lines.append(
                f"- group={x.consumer_group} topic={x.topic}{_broker(x)} queue={x.queue_id}"
                f"  raised_at={x.dead_at}\n  {x.reason}"
            )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Stall:
    """One stalled ``(group, topic, broker group, queue)`` and its evidence."""

    group: str
    queue: QueueRef
    watermark: int
    #: when the watermark last moved (``consume_progress.updated_at``)
    still_since: dt.datetime
    #: the broker's max offset there; ``None``: no probe answer (the age of the waiting row decided)
    broker_max: int | None
    #: the first offset the group can still read there: the watermark's next, or the broker's min offset
    #: when its retention deleted beyond the watermark
    readable_from: int
    #: the oldest message the group owes there, and since when
    waiting: str
    waiting_since: dt.datetime

    def reason(self, stall_after: dt.timedelta) -> str:
        q = self.queue
        on = f" of {q.broker_name}" if q.broker_name else ""
        head = (
            f"{queue_tag(STALLED_TAG, q, self.watermark)} group {self.group} has consumed nothing on "
            f"{q.topic} queue {q.queue_id}{on} since {self.still_since.isoformat()} "
            f"(stall_after {stall_after}); its position stays at offset {self.watermark}"
        )
        if self.broker_max is not None and self.broker_max > self.readable_from:
            beyond = self.broker_max - self.readable_from
            evidence = (
                f" while the broker holds {beyond} message(s) beyond it (max offset {self.broker_max}); the "
                f"first it owes is {self.waiting}, sent {self.waiting_since.isoformat()}."
            )
        elif self.broker_max is not None:  # all it owed there was deleted by retention, and re-sent
            evidence = (
                f" while the broker's retention deleted what it owed there (min offset "
                f"{self.readable_from}) and the copies re-sent to it are not taken either; the first is "
                f"{self.waiting}, re-sent {self.waiting_since.isoformat()}."
            )
        else:  # without a probe the age rules go on re-sending: a stopped group and a lost copy look alike
            return head + (
                f" while it still owes {self.waiting} (PENDING since {self.waiting_since.isoformat()}; no "
                "broker probe: stopped consumers, or messages lost on the way). Rows older than "
                "max_unconfirmed_age are re-sent meanwhile: check the group's consumers."
            )
        return head + evidence + " No resend is made meanwhile: check the group's consumers."
