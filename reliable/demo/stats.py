"""Counting what happened, per consumer group, from the contract tables only (what the reconciliation reads).

Two levels: :func:`snapshot` is three grouped ``COUNT`` queries, cheap enough for the live display twice a
second; :func:`duplicate_causes` reads the journal of the demo's topic once at the end and attributes every
extra delivery of a (group, message) to a cause, with the same rules as the reconciliation report
(:class:`reliable.reconcile.config.DuplicateCause`), so the two agree on every count.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy import ColumnElement, Engine, case, func, select

from reliable.models import MessageInbox, MessageLog, MessageStub
from reliable.reconcile.config import RETRY_TOPIC_PREFIX, DuplicateCause
from reliable.types import LogOutcome, StubStatus


@dataclass(frozen=True, slots=True)
class GroupSnapshot:
    """One consumer group's counters at one moment: its inbox rows and its deliveries."""

    inbox_rows: int = 0
    confirmed: int = 0
    pending: int = 0
    dead: int = 0
    deliveries: int = 0
    distinct_delivered: int = 0
    duplicates_suppressed: int = 0
    retries: int = 0
    dead_lettered: int = 0

    @property
    def duplicates_delivered(self) -> int:
        """Deliveries beyond the first of each message id (to this group)."""
        return self.deliveries - self.distinct_delivered

    @property
    def settled(self) -> int:
        return self.confirmed + self.dead


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Counters of the demo's topic at one moment: the messages, and every group's share."""

    messages: int = 0
    #: ``sum(send_count - 1)`` over the messages: topic-wide sends after the first
    resent: int = 0
    groups: dict[str, GroupSnapshot] = field(default_factory=dict)

    def _sum(self, name: str) -> int:
        return sum(int(getattr(g, name)) for g in self.groups.values())

    @property
    def confirmed(self) -> int:
        """(group, message) pairs confirmed."""
        return self._sum("confirmed")

    @property
    def pending(self) -> int:
        return self._sum("pending")

    @property
    def dead(self) -> int:
        return self._sum("dead")

    @property
    def settled(self) -> int:
        """(group, message) pairs CONFIRMED or DEAD: the run is over when this reaches messages × groups."""
        return self._sum("settled")

    @property
    def deliveries(self) -> int:
        return self._sum("deliveries")

    @property
    def duplicates_delivered(self) -> int:
        return self._sum("duplicates_delivered")

    @property
    def duplicates_suppressed(self) -> int:
        return self._sum("duplicates_suppressed")

    def group(self, name: str) -> GroupSnapshot:
        return self.groups.get(name, GroupSnapshot())


def _count_if(cond: ColumnElement[bool]) -> ColumnElement[int]:
    return func.coalesce(func.sum(case((cond, 1), else_=0)), 0)


def snapshot(engine: Engine, topic: str) -> Snapshot:
    """Current counters for ``topic`` (three queries)."""
    s, ib, lg = MessageStub, MessageInbox, MessageLog
    with engine.connect() as conn:
        messages, resent = conn.execute(
            select(
                func.count(),
                func.coalesce(func.sum(case((s.send_count > 1, s.send_count - 1), else_=0)), 0),
            ).where(s.topic == topic)
        ).one()
        inbox = {
            str(row[0]): row[1:]
            for row in conn.execute(
                select(
                    ib.consumer_group,
                    func.count(),
                    _count_if(ib.status == StubStatus.CONFIRMED),
                    _count_if(ib.status == StubStatus.PENDING),
                    _count_if(ib.status == StubStatus.DEAD),
                )
                .join(s, s.message_id == ib.message_id)
                .where(s.topic == topic)
                .group_by(ib.consumer_group)
            )
        }
        logs = {
            str(row[0]): row[1:]
            for row in conn.execute(
                select(
                    lg.consumer_group,
                    func.count(),
                    func.count(func.distinct(lg.message_id)),
                    _count_if(lg.outcome == LogOutcome.DUPLICATE),
                    _count_if(lg.outcome == LogOutcome.RETRY),
                    _count_if(lg.outcome == LogOutcome.DEAD_LETTER),
                )
                .where(lg.original_topic == topic)
                .group_by(lg.consumer_group)
            )
        }
    groups = {}
    for name in sorted(set(inbox) | set(logs)):
        i = inbox.get(name, (0, 0, 0, 0))
        lo = logs.get(name, (0, 0, 0, 0, 0))
        groups[name] = GroupSnapshot(*(int(v) for v in (*i, *lo)))
    return Snapshot(messages=int(messages), resent=int(resent), groups=groups)


def duplicate_causes(engine: Engine, topic: str) -> dict[str, dict[str, int]]:
    """Per group: every delivery beyond the first of a message, attributed to a :class:`DuplicateCause`.

    In delivery order (received_at, then log id), for each (group, message): ``reconsume_times > 0`` is a
    broker retry; a delivered (topic, broker group, queue, offset) seen before is a redelivery; a new position
    in the group's ``%RETRY%{group}`` topic is the sweeper's targeted resend; any other new position is a
    second copy in the topic (producer double-send or a topic-wide resend).
    """
    lg = MessageLog
    seen: dict[tuple[str, str], set[tuple[str, str, int, int]]] = {}
    resent: dict[tuple[str, str], bool] = {}  # a targeted copy of the pair was delivered already
    causes: dict[str, Counter[str]] = {}
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                lg.consumer_group,
                lg.message_id,
                lg.topic,
                lg.broker_name,
                lg.queue_id,
                lg.queue_offset,
                lg.reconsume_times,
            )
            .where(lg.original_topic == topic)
            .order_by(lg.received_at, lg.id)
        )
        for group, message_id, delivered, broker, queue_id, queue_offset, reconsume_times in rows:
            pos = (str(delivered), str(broker), int(queue_id), int(queue_offset))
            mine = causes.setdefault(str(group), Counter())
            retry_copy = pos[0] == RETRY_TOPIC_PREFIX + str(group)
            targeted = retry_copy and not (reconsume_times and int(reconsume_times) > 0)
            positions = seen.get((group, message_id))
            if positions is None:
                seen[(group, message_id)] = {pos}
                resent[(group, message_id)] = targeted
                continue
            if reconsume_times and int(reconsume_times) > 0:
                mine[DuplicateCause.RETRY] += 1
            elif pos in positions:
                mine[DuplicateCause.REDELIVERY] += 1
            elif retry_copy or resent[(group, message_id)]:  # after a targeted copy: the original, overtaken
                mine[DuplicateCause.TARGETED_RESEND] += 1
            else:
                mine[DuplicateCause.PRODUCER_DOUBLE_SEND] += 1
            positions.add(pos)
            resent[(group, message_id)] = resent[(group, message_id)] or targeted
    return {g: {c.value: counter[c] for c in DuplicateCause} for g, counter in sorted(causes.items())}
