"""Counting what happened, from the contract tables only (the same evidence the reconciliation reads).

Two levels: :func:`snapshot` is a handful of ``COUNT`` queries cheap enough for the live display twice a
second; :func:`duplicate_causes` reads the journal of the demo's topic once at the end and attributes every
extra delivery to a cause.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sqlalchemy import Engine, case, func, select

from reliable.models import MessageLog, MessageStub
from reliable.types import LogOutcome, StubStatus


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Counters of the demo's topic at one moment."""

    stubs: int = 0
    confirmed: int = 0
    pending: int = 0
    dead: int = 0
    resent: int = 0
    deliveries: int = 0
    distinct_delivered: int = 0
    duplicates_suppressed: int = 0
    retries: int = 0
    dead_lettered: int = 0

    @property
    def duplicates_delivered(self) -> int:
        """Deliveries beyond the first of each message id."""
        return self.deliveries - self.distinct_delivered

    @property
    def settled(self) -> int:
        return self.confirmed + self.dead


def snapshot(engine: Engine, topic: str) -> Snapshot:
    """Current counters for ``topic`` (two queries)."""
    s = MessageStub
    lg = MessageLog
    with engine.connect() as conn:
        row = conn.execute(
            select(
                func.count(),
                func.coalesce(func.sum(case((s.status == StubStatus.CONFIRMED, 1), else_=0)), 0),
                func.coalesce(func.sum(case((s.status == StubStatus.PENDING, 1), else_=0)), 0),
                func.coalesce(func.sum(case((s.status == StubStatus.DEAD, 1), else_=0)), 0),
                func.coalesce(func.sum(case((s.send_count > 1, s.send_count - 1), else_=0)), 0),
            ).where(s.topic == topic)
        ).one()
        log_row = conn.execute(
            select(
                func.count(),
                func.count(func.distinct(lg.message_id)),
                func.coalesce(func.sum(case((lg.outcome == LogOutcome.DUPLICATE, 1), else_=0)), 0),
                func.coalesce(func.sum(case((lg.outcome == LogOutcome.RETRY, 1), else_=0)), 0),
                func.coalesce(func.sum(case((lg.outcome == LogOutcome.DEAD_LETTER, 1), else_=0)), 0),
            ).where(lg.topic == topic)
        ).one()
    return Snapshot(
        stubs=int(row[0]),
        confirmed=int(row[1]),
        pending=int(row[2]),
        dead=int(row[3]),
        resent=int(row[4]),
        deliveries=int(log_row[0]),
        distinct_delivered=int(log_row[1]),
        duplicates_suppressed=int(log_row[2]),
        retries=int(log_row[3]),
        dead_lettered=int(log_row[4]),
    )


class DuplicateCause:
    """Why a message arrived more than once (the reconciliation report uses the same three causes)."""

    RETRY = "retry"  # the consumer asked for it again (reconsume_times > 0, via %RETRY%)
    REDELIVERY = "redelivery"  # the same queue offset again: uncommitted offset after a kill or rebalance
    DOUBLE_SEND = (
        "producer_double_send"  # a new queue offset: lost send ACK retried, or re-sent by the sweeper
    )


def duplicate_causes(engine: Engine, topic: str) -> dict[str, int]:
    """Attribute every delivery beyond the first of a message id to a :class:`DuplicateCause`.

    A delivery with ``reconsume_times > 0`` is a retry; otherwise, the same ``(queue_id, queue_offset)`` as an
    earlier delivery of that id is a redelivery, and a position never seen for that id is a second copy in
    the queue, which only a second send can create.
    """
    lg = MessageLog
    seen: dict[str, set[tuple[int, int]]] = {}
    causes: Counter[str] = Counter()
    with engine.connect() as conn:
        rows = conn.execute(
            select(lg.message_id, lg.queue_id, lg.queue_offset, lg.reconsume_times)
            .where(lg.topic == topic)
            .order_by(lg.id)
        )
        for message_id, queue_id, queue_offset, reconsume_times in rows:
            pos = (int(queue_id), int(queue_offset))
            positions = seen.get(message_id)
            if positions is None:
                seen[message_id] = {pos}
                continue
            if reconsume_times and int(reconsume_times) > 0:
                causes[DuplicateCause.RETRY] += 1
            elif pos in positions:
                causes[DuplicateCause.REDELIVERY] += 1
            else:
                causes[DuplicateCause.DOUBLE_SEND] += 1
            positions.add(pos)
    return {
        DuplicateCause.REDELIVERY: causes[DuplicateCause.REDELIVERY],
        DuplicateCause.RETRY: causes[DuplicateCause.RETRY],
        DuplicateCause.DOUBLE_SEND: causes[DuplicateCause.DOUBLE_SEND],
    }
