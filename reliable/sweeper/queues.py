"""Which watermark a copy is compared with: a queue is ``(topic, broker_name, queue_id)``.

On a RocketMQ cluster of several broker groups, queue 0 of ``orders`` on ``broker-a`` and queue 0 of
``orders`` on ``broker-b`` have independent offsets; the guard keeps one ``consume_progress`` row per
``(group, topic, broker_name, queue_id)`` and the sweeper must compare a copy's offset with the watermark
of *its* broker group only — broker-a's queue 0 moving far ahead says nothing about a message on broker-b's
queue 0.

``broker_name = ''`` means "no broker groups" (Kafka, RabbitMQ, a single broker_sim broker: every row of
the queue has ``''`` and the old rule applies unchanged) or "written before migration 0006" (an upgrade in
place). A copy without a broker name is matched like this (:func:`resolve`):

* the group's rows of that ``(topic, queue_id)`` all have ``''`` (or there are none): the ``''`` row is the
  queue's watermark, exactly as before 0006;
* some row names a broker group: the cluster has groups and the copy's is unknown. Comparing with any one
  group's watermark could declare a merely queued message overtaken (or a lost one queued), so the copy's
  position is **unknown**: no overtaken/lost verdict and no never-consumed alarm from it; the sweeper falls
  back to ``max_unconfirmed_age`` (:data:`Position.known` is false).

A copy *with* a broker name is compared with that group's row only; for the never-consumed alarm a ``''``
row of the same queue id counts as "the group has consumed here" (it may predate the upgrade).

A copy whose queue the send could not tell (``UNKNOWN_QUEUE_ID``: a RocketMQ 5.x send, where the proxy picks
the queue and does not say which) has no watermark to compare with; what the sweeper can still tell is
whether the group has consumed the topic at all (:func:`consumed_topics`): a group that never has raises
the never-consumed alarm instead of re-sends that every other group of the shared topic would take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection, select

from reliable.outbox.keys import columns_in
from reliable.sweeper.backoff import QueueProgress
from reliable.sweeper.selection import progress

#: (consumer_group, topic, broker_name, queue_id) of a ``consume_progress`` row
ProgressKey = tuple[str, str, str, int]
#: (consumer_group, topic, queue_id): every broker group's row of that queue id is loaded
QueueIdKey = tuple[str, str, int]


def load_progress(conn: Connection, keys: set[QueueIdKey]) -> dict[ProgressKey, QueueProgress]:
    """The ``consume_progress`` rows of ``keys``, every broker group's (one statement)."""
    if not keys:
        return {}
    # (group, topic) pairs and queue ids apart: a batch has few of each, and the rows read beyond ``keys``
    # (another asked pair's queue id) are dropped here
    pairs = sorted({(g, t) for g, t, _ in keys})
    queue_ids = sorted({q for _, _, q in keys})
    clause = columns_in(conn, progress.c.consumer_group, progress.c.topic, pairs)
    rows = conn.execute(select(progress).where(clause, progress.c.queue_id.in_(queue_ids))).all()
    return {
        (r.consumer_group, r.topic, r.broker_name, r.queue_id): QueueProgress(
            r.max_offset, r.min_offset, r.created_at, r.updated_at, r.received_count
        )
        for r in rows
        if (r.consumer_group, r.topic, r.queue_id) in keys
    }


@dataclass(slots=True)
class Watermarks:
    """The ``consume_progress`` rows one batch has read, by the ``(group, topic, queue_id)`` asked for: the
    watermarks triage read for the copies' queues also serve the backlog estimate of the resends that land
    on the same queues (a targeted resend's ``%RETRY%`` queue after the first), without a second read. A
    batch lasts milliseconds, and the estimate only spaces the next look."""

    rows: dict[ProgressKey, QueueProgress] = field(default_factory=dict)
    asked: set[QueueIdKey] = field(default_factory=set)

    def load(self, conn: Connection, keys: set[QueueIdKey]) -> dict[ProgressKey, QueueProgress]:
        """The rows of ``keys`` and of every key asked before (one statement for the keys not asked yet)."""
        missing = keys - self.asked
        if missing:
            self.rows.update(load_progress(conn, missing))
            self.asked |= missing
        return self.rows


@dataclass(frozen=True, slots=True)
class Position:
    """What the group's watermarks say about one copy's queue."""

    #: the watermark row to compare with; ``None``: none (or the position is not known)
    progress: QueueProgress | None
    #: whether the copy's queue is known; ``False``: a copy without a broker name on a cluster with groups
    known: bool = True
    #: whether the group has consumed this queue id at all (any row that may be this queue)
    consumed: bool = False


def resolve(
    queues: dict[ProgressKey, QueueProgress], group: str, topic: str, broker_name: str, queue_id: int
) -> Position:
    """The watermark of the copy at ``(topic, broker_name, queue_id)`` (see the module docstring)."""
    exact = queues.get((group, topic, broker_name, queue_id))
    if broker_name:
        legacy = queues.get((group, topic, "", queue_id))
        return Position(exact, consumed=exact is not None or legacy is not None)
    named = any(g == group and t == topic and q == queue_id and b for g, t, b, q in queues)
    if named:
        return Position(None, known=False, consumed=True)
    return Position(exact, consumed=exact is not None)


def consumed_topics(conn: Connection, pairs: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which ``(consumer_group, topic)`` of ``pairs`` have a ``consume_progress`` row on any queue (one
    statement)."""
    if not pairs:
        return set()
    clause = columns_in(conn, progress.c.consumer_group, progress.c.topic, sorted(pairs))
    rows = conn.execute(select(progress.c.consumer_group, progress.c.topic).where(clause).distinct()).all()
    return {(r[0], r[1]) for r in rows}
