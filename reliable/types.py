"""Value types shared by every part of `reliable`: statuses, outcomes and the delivery envelope.

Statuses are ``str`` enums so that they are stored in the database as their readable names (the tables are a
contract read by the Spark job, DBAs and dashboards) while the code never compares raw strings.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class StubStatus(enum.StrEnum):
    """Life cycle of a ``message_stub`` row (DESIGN.md §1)."""

    PENDING = "PENDING"  # written by the producer; not yet confirmed by the consumer group
    CONFIRMED = "CONFIRMED"  # the consumer committed its work together with this status
    VOIDED = "VOIDED"  # cancelled by the producer; consumers skip it
    DEAD = "DEAD"  # resends exhausted: a person must look at it


class LogOutcome(enum.StrEnum):
    """What became of one delivery, as journaled in ``message_log.outcome``."""

    SUCCESS = "SUCCESS"
    DUPLICATE = "DUPLICATE"
    RETRY = "RETRY"
    DEAD_LETTER = "DEAD_LETTER"


class ConsumeResult(enum.StrEnum):
    """What a guarded handler tells the broker adapter to do with a delivery."""

    SUCCESS = "SUCCESS"  # acknowledge: the effect is applied (now or earlier)
    RECONSUME_LATER = "RECONSUME_LATER"  # redeliver later (broker retry path)
    DEAD_LETTER = "DEAD_LETTER"  # give up on this delivery: dead-letter queue / exchange now


@dataclass(frozen=True, slots=True)
class Envelope:
    """A broker-neutral view of one delivery.

    ``message_id`` is the business id that links producer and consumer (RocketMQ best practice: also the
    message *keys*). Adapters fill it from the broker's message; ``None``/empty means the delivery carries no
    usable id, which the guard treats as bad input (dead letter with a reason), never as a silent ack.
    """

    message_id: str | None
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    keys: str | None = None
    tags: str | None = None
    reconsume_times: int = 0
    properties: Mapping[str, str] = field(default_factory=dict)
    #: the topic this delivery came from (``%RETRY%g``, ...); None = ``topic`` (contracts.md)
    delivered_topic: str | None = None

    @property
    def source_topic(self) -> str:
        return self.delivered_topic or self.topic
