"""RocketMQ names, defaults and the retry/delay arithmetic (reference §C, §G)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
#: the group of the producer a consumer sends its own retry copies with (MixAll.CLIENT_INNER_PRODUCER_GROUP)
INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
SYSTEM_TOPICS = frozenset(
    {AUTO_CREATE_TOPIC_KEY_TOPIC, SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC}
)

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DEFAULT_MAX_RECONSUME_TIMES = 16

_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(spec: str = DEFAULT_DELAY_LEVELS) -> list[int]:
    """``"1s 5s ... 2h"`` → delays in ms; index 0 is level 1. ValueError for a malformed entry."""
    out = []
    for item in spec.split():
        unit = item[-1]
        if unit not in _UNITS_MS or not item[:-1].isdigit():
            raise ValueError(f"bad delay level {item!r} in {spec!r}")
        out.append(int(item[:-1]) * _UNITS_MS[unit])
    if not out:
        raise ValueError("no delay levels")
    return out


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


class SendBackTarget(enum.Enum):
    RETRY = "RETRY"
    DLQ = "DLQ"


@dataclass(frozen=True)
class SendBackDecision:
    target: SendBackTarget
    delay_level: int  # level used for the %RETRY% copy (0 for DLQ)


def send_back_decision(
    reconsume_times: int, delay_level: int, max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES
) -> SendBackDecision:
    """Where CONSUMER_SEND_MSG_BACK puts a failed message.

    ``reconsume_times`` is how often the message has already come back. At or beyond the group's maximum, or
    when the client asks for a negative level ("dead-letter now"), it goes to ``%DLQ%``; otherwise to
    ``%RETRY%`` at the client's level, where level 0 means "the broker chooses": ``3 + reconsume_times``, i.e.
    10 s, 30 s, 1 m, 2 m … 2 h (the last level is reused if the table is shorter than the maximum).
    """
    if delay_level < 0 or reconsume_times >= max_reconsume_times:
        return SendBackDecision(SendBackTarget.DLQ, 0)
    level = 3 + reconsume_times if delay_level == 0 else delay_level
    return SendBackDecision(SendBackTarget.RETRY, level)


def clamp_level(level: int, levels: int) -> int:
    """Levels above the table's size use its last level (RocketMQ does the same)."""
    return max(1, min(level, levels))


def parse_tag_expression(expression: str | None) -> frozenset[str] | None:
    """``"*"``/empty → None (every tag); ``"A || B"`` → {"A", "B"}. ValueError for an expression with no
    tag."""
    if expression is None or expression.strip() in ("", "*"):
        return None
    tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
    if not tags:
        raise ValueError(f"subscription expression {expression!r} names no tag")
    return tags
