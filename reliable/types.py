"""Value types shared by every part of `reliable`: statuses, outcomes and the delivery envelope.

Statuses are ``str`` enums so that they are stored in the database as their readable names (the tables are a
contract read by the Spark job, DBAs and dashboards) while the code never compares raw strings.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class StubStatus(enum.StrEnum):
    """Life cycle of a ``message_stub`` row and of a group's ``message_inbox`` row (DESIGN.md §1).

    One vocabulary for both: an inbox row is one group's view of the message, and the stub's status is
    derived from its inbox rows (every group ``CONFIRMED`` → ``CONFIRMED``; some ``DEAD`` → ``DEAD``).
    """

    PENDING = "PENDING"  # staged by the producer; not yet confirmed (by every expected group, for a stub)
    CONFIRMED = "CONFIRMED"  # the consumer committed its work together with this status
    VOIDED = "VOIDED"  # cancelled by the producer; consumers skip it
    DEAD = "DEAD"  # resends exhausted: a person must look at it


#: the status of a ``message_inbox`` row: the same values as a stub's (one vocabulary, two names for readers)
InboxStatus = StubStatus


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

    ``topic`` is the message's original (business) topic — for a ``%RETRY%{group}`` delivery, the
    ``RETRY_TOPIC`` property. ``queue_id``/``queue_offset`` are the position of *this delivery* in
    ``delivered_topic`` (``None``: the same as ``topic``). The guard journals that delivered position and
    raises only that queue's watermark.

    ``broker_name`` is the RocketMQ broker group (``brokerName``) the delivery came from: on a cluster of
    several groups, queue 0 of ``broker-a`` and queue 0 of ``broker-b`` are different queues, so a queue is
    ``(source_topic, broker_name, queue_id)``. ``""`` where the broker has no groups (Kafka, RabbitMQ) or the
    adapter cannot tell.
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
    #: the topic the delivery came from (``%RETRY%billing``, ``orders.retry.1`` …); ``None``: ``topic``.
    delivered_topic: str | None = None
    #: the RocketMQ broker group of ``queue_id``; ``""``: none, or unknown
    broker_name: str = ""
    #: the broker will not deliver the message again if this delivery fails (its retries are spent: a
    #: Kafka loop's last retry topic); the guard then treats a handler failure as its last, as at
    #: ``max_attempts``: dead-lettered with the reason, the group's row DEAD, a person told
    last_attempt: bool = False
    #: the adapter could not read this delivery, and why (a Kafka header that is not UTF-8): the guard
    #: journals it as ``bad_message`` with this reason and dead-letters it without running the handler, so
    #: the reconciliation report counts it. The adapter's own value, never taken from the wire.
    bad_input: str | None = None
    #: the consumer group a sweeper's resend is meant for, from the copy's label (Kafka's
    #: ``reliable-target-group`` header, RocketMQ 5.x's ``RELIABLE_TARGET_GROUP`` property): a sender that
    #: cannot address one group puts the copy on the topic, where every group gets it. ``None``: a copy for
    #: every group (the producer's), or the broker cannot tell. A group that gave up on the message answers a
    #: copy meant for another group as a settled duplicate instead of dead-lettering it again
    target_group: str | None = None
    #: the broker stored this copy anew to redeliver it (RocketMQ 5.x revives a message whose invisible time
    #: ran out into the group's pop retry topic, ``delivered_topic``, at a new offset): a redelivery of a
    #: record the group dead-lettered is then not at that record's position, and the guard's check whether a
    #: copy labelled for another group is the group's fatal record matches the message on its topic instead
    revived: bool = False

    @property
    def source_topic(self) -> str:
        """The topic of ``queue_id``/``queue_offset``: where this delivery actually came from."""
        return self.delivered_topic or self.topic
