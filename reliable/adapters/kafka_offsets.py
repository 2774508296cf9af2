"""Kafka offsets kept in the application database (table ``kafka_offset``, migration 0004).

Kafka's own offset commit is a separate step after the database commit: a consumer that dies between the
two, or a commit the broker loses, makes the group replay records it already processed. The guard turns those
replays into suppressed duplicates, but they still cost a delivery each and show up as duplicates. With the
position written *in the guard's transaction* (:func:`offsets_in_db` wraps the handler so it runs inside the
same ``session``), the work and the position commit together; on partition assignment the consumer seeks to
the stored position (:func:`load`), so nothing already processed is delivered again.

Records that never reach the handler (duplicates, dead letters, records forwarded to a retry topic) are
recorded by the consumer loop after their final answer (:func:`record_many`, its own short transaction): a
crash before that write replays them, which the guard absorbs as a duplicate.

The position only moves forward (``GREATEST``), so a late writer of an older offset (a consumer that lost its
partition in a rebalance) cannot move it back.
Pure SQLAlchemy, no Kafka client: the asyncio adapter reuses it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

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


def offsets_in_db(group: str) -> Any:
    """Decorator: the handler also records ``env``'s next offset in the guard's transaction.

    ::

        @idempotent_consumer(rel, group="billing")
        @offsets_in_db("billing")
        def handle(env, session): ...

    The position recorded is the one of the delivered topic (a retry topic for a retry delivery).
    """

    def wrap(handler: Any) -> Any:
        @functools.wraps(handler)
        def with_offset(env: Envelope, session: Session) -> Any:
            out = handler(env, session)
            record_many(
                session, group, {(env.delivered_topic or env.topic, env.queue_id): env.queue_offset + 1}
            )
            return out

        return with_offset

    return wrap
