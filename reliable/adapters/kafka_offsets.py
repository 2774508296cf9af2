"""Kafka offsets kept in the application database (table ``kafka_offset``, migration 0004).

Kafka's own offset commit is a separate step after the database commit: a consumer that dies between the
two, or a commit the broker loses, makes the group replay records it already processed. The guard turns those
replays into suppressed duplicates, but they still cost a delivery each and show up as duplicates. With the
position written *in the guard's transaction* (:func:`offsets_in_db` wraps the handler so it runs inside the
same ``session``), the work and the position commit together; on partition assignment the consumer seeks to
the stored position (:func:`load`), so nothing already processed is delivered again.

The position written in the guard's transaction never goes past the partition's first record whose answer
is not final yet: the consumer loop gives each record a *commit floor* (envelope property
:data:`~reliable.constants.KAFKA_COMMIT_FLOOR_PROPERTY`) and :func:`offsets_in_db` stores
``min(floor, offset + 1)``. Until 2026-11-28 it stored ``offset + 1`` for every processed record: a record
whose handler failed, followed in its partition by one that succeeded, had its position stored past it before
its retry copy was produced (a batch commits every record of its chunk before the loop learns one failed),
and a crash or rebalance then started the group after it — the failed record was never retried. The floor is
the first record of a batch chunk (any of them may fail), or an earlier record of the partition whose retry or
dead-letter copy is not confirmed yet; the loop moves the position on after the copies' delivery reports.

Records that never reach the handler (duplicates, dead letters, records forwarded to a retry topic) are
recorded by the consumer loop after their final answer (:func:`record_many`, its own short transaction): a
crash before that write replays them, which the guard absorbs as a duplicate.

The position only moves forward (``GREATEST``), so a late writer of an older offset (a consumer that lost its
partition in a rebalance) cannot move it back.
Pure SQLAlchemy, no Kafka client: the asyncio adapter reuses it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from reliable import constants as C
from reliable.models import KafkaOffset, utcnow
from reliable.types import Envelope

TopicPartition = tuple[str, int]

_UPSERT = {
    "postgresql": (
        "INSERT INTO kafka_offset (consumer_group, topic, partition, next_offset, updated_at) "
        "VALUES (:g, :t, :p, :o, :now) ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET "
        "next_offset = GREATEST(kafka_offset.next_offset, EXCLUDED.next_offset), "
        "updated_at = EXCLUDED.updated_at"
    ),
    "sqlite": (
        "INSERT INTO kafka_offset (consumer_group, topic, partition, next_offset, updated_at) "
        "VALUES (:g, :t, :p, :o, :now) ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET "
        "next_offset = max(next_offset, excluded.next_offset), updated_at = excluded.updated_at"
    ),
    "mysql": (
        "INSERT INTO kafka_offset (consumer_group, topic, `partition`, next_offset, updated_at) "
        "VALUES (:g, :t, :p, :o, :now) ON DUPLICATE KEY UPDATE "
        "next_offset = GREATEST(next_offset, VALUES(next_offset)), updated_at = VALUES(updated_at)"
    ),
}
_UPSERT["mariadb"] = _UPSERT["mysql"]


def _params(group: str, positions: Mapping[TopicPartition, int]) -> list[dict[str, Any]]:
    now = utcnow()
    return [{"g": group, "t": t, "p": p, "o": o, "now": now} for (t, p), o in sorted(positions.items())]


def record_many(session: Session, group: str, positions: Mapping[TopicPartition, int]) -> None:
    """Raise the stored next offset of each ``(topic, partition)`` to at least the given one."""
    if positions:
        session.execute(text(_UPSERT[session.get_bind().dialect.name]), _params(group, positions))


def record_engine(engine: Engine, group: str, positions: Mapping[TopicPartition, int]) -> None:
    """:func:`record_many` in a transaction of its own."""
    if positions:
        with engine.begin() as conn:
            conn.execute(text(_UPSERT[engine.dialect.name]), _params(group, positions))


def load(engine: Engine, group: str, topics: Iterable[str]) -> dict[TopicPartition, int]:
    """The stored next offsets of ``group`` on ``topics``."""
    wanted = list(topics)
    stmt = select(KafkaOffset.topic, KafkaOffset.partition, KafkaOffset.next_offset).where(
        KafkaOffset.consumer_group == group, KafkaOffset.topic.in_(wanted)
    )
    with engine.connect() as conn:
        return {(t, p): o for t, p, o in conn.execute(stmt)}


def next_offset(env: Envelope) -> int:
    """The position :func:`offsets_in_db` may store for ``env``: one past it, at most its commit floor."""
    floor = env.properties.get(C.KAFKA_COMMIT_FLOOR_PROPERTY)
    return env.queue_offset + 1 if floor is None else min(int(floor), env.queue_offset + 1)


def with_floor(env: Envelope, *floors: int | None) -> Envelope:
    """``env`` carrying the lowest of ``floors`` (``None``: no limit) as its commit floor."""
    floor = min((f for f in floors if f is not None), default=None)
    if floor is None:
        return env
    return dataclasses.replace(env, properties={**env.properties, C.KAFKA_COMMIT_FLOOR_PROPERTY: str(floor)})


def offsets_in_db(group: str) -> Any:
    """Decorator: the handler also records ``env``'s next offset in the guard's transaction.

    ::

        @idempotent_consumer(rel, group="billing")
        @offsets_in_db("billing")
        def handle(env, session): ...

    The position recorded is the one of the delivered topic (a retry topic for a retry delivery), capped at
    the commit floor the consumer loop set on ``env`` (module doc); a caller that sets none delivers one
    record at a time and vouches that every earlier record of the partition is final.
    """

    def wrap(handler: Any) -> Any:
        @functools.wraps(handler)
        def with_offset(env: Envelope, session: Session) -> Any:
            out = handler(env, session)
            record_many(session, group, {(env.delivered_topic or env.topic, env.queue_id): next_offset(env)})
            return out

        return with_offset

    return wrap
