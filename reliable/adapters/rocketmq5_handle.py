"""Where a RocketMQ 5.x delivery came from, read from its receipt handle.

Why a module of its own: the 5.x Python client drops the system properties that carry a delivery's queue and
offset but keeps the receipt handle, whose layout RocketMQ fixes (``ExtraInfoUtil`` in apache/rocketmq 5.x;
fields joined by a space)::

    start_offset retrieve_ms invisible_ms revive_qid topic_type broker queue_id queue_offset commit_log_offset
    [0]          [1]         [2]          [3]        [4]        [5]    [6]      [7]          [8]

``topic_type`` says *which* topic ``queue_id``/``queue_offset`` belong to. A non-FIFO message whose invisible
time runs out without an ack is revived by the broker into the group's pop retry topic — ``%RETRY%{group}_
{topic}`` (``"1"``), or ``%RETRY%{group}+{topic}`` (``"2"``, a broker with ``enableRetryTopicV2``) — at
queue 0 and a new offset; the client still shows the original topic and message id. Read as a position of
the original topic, every such delivery was journaled at the topic's queue 0 at an offset that is some other
message there: queue 0's watermark jumped ahead (the sweeper re-sent queued messages, the report counted
false *lost*, a real stall of queue 0 went unseen). So the position is the retry topic's, named here.
"""

from __future__ import annotations

import enum
import hashlib
import logging
from dataclasses import dataclass

from reliable import constants as C

log = logging.getLogger("reliable.adapters.rocketmq5")

#: receipt handle fields: [4] topic type, [5] broker name, [6] queue id, [7] queue offset
_TYPE, _BROKER, _QUEUE, _OFFSET = 4, 5, 6, 7


class TopicType(enum.StrEnum):
    """Handle field [4]: the topic the handle's queue and offset belong to."""

    NORMAL = "0"  # the message's own topic
    RETRY_V1 = "1"  # the group's pop retry topic %RETRY%{group}_{topic}
    RETRY_V2 = "2"  # the same, named %RETRY%{group}+{topic} (enableRetryTopicV2)


_SEPARATOR = {TopicType.RETRY_V1: C.POP_RETRY_SEPARATOR_V1, TopicType.RETRY_V2: C.POP_RETRY_SEPARATOR_V2}


@dataclass(frozen=True, slots=True)
class HandlePosition:
    """The delivered position a receipt handle names (``queue_id`` ``UNKNOWN_QUEUE_ID``: it names none)."""

    broker_name: str
    queue_id: int
    queue_offset: int
    topic_type: TopicType = TopicType.NORMAL

    @property
    def revived(self) -> bool:
        """The copy came from the group's pop retry topic (a redelivery the broker stored anew)."""
        return self.topic_type is not TopicType.NORMAL


UNKNOWN = HandlePosition("", C.UNKNOWN_QUEUE_ID, -1)


def parse_handle(receipt_handle: str | None) -> HandlePosition:
    """The position of a receipt handle; :data:`UNKNOWN` for one without a readable position (a topic type
    this code does not know included: its queue and offset belong to a topic it cannot name)."""
    parts = (receipt_handle or "").split(" ")
    try:
        return HandlePosition(
            parts[_BROKER], int(parts[_QUEUE]), int(parts[_OFFSET]), TopicType(parts[_TYPE])
        )
    except (IndexError, ValueError):
        log.warning("receipt handle without a queue position: %r", receipt_handle)
        return UNKNOWN


def pop_retry_topic(group: str, topic: str, topic_type: TopicType) -> str:
    """The name of ``group``'s pop retry topic for ``topic`` (``topic_type`` RETRY_V1 or RETRY_V2).

    A name longer than a topic column (``TOPIC_MAX``; the broker allows longer ones) keeps its start and
    ends in a digest of the whole name, so it stays one queue of its own and is never the topic's."""
    name = f"{C.ROCKETMQ_RETRY_PREFIX}{group}{_SEPARATOR[topic_type]}{topic}"
    if len(name) <= C.TOPIC_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[: C.POP_RETRY_DIGEST_CHARS]
    return f"{name[: C.TOPIC_MAX - len(digest) - 1]}#{digest}"
