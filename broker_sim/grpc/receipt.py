"""Receipt handles: the opaque token a 5.x consumer acks or extends a delivery with.

We keep RocketMQ's own layout (``ReceiptHandle.encode`` in apache/rocketmq 5.x: fields joined by a space),
because adapters read the delivery's queue and offset from it — the 5.x Python client drops the
``queue_id``/``queue_offset`` system properties but keeps the handle::

    start_offset retrieve_ms invisible_ms revive_qid topic_type broker queue_id queue_offset commit_log_offset
    [0]          [1]         [2]          [3]        [4]        [5]    [6]      [7]          [8]

broker_sim appends one field, ``[9]`` = a serial number, so a handle given out before a redelivery or an
invisible-duration change is told apart from the current one (the stale one is refused, as 5.x does).
"""

from __future__ import annotations

from dataclasses import dataclass

NORMAL_TOPIC = "0"
_FIELDS = 10


class InvalidReceiptHandleError(ValueError):
    """A receipt handle that is malformed, stale or expired."""


@dataclass(frozen=True)
class ReceiptHandle:
    start_offset: int
    retrieve_ms: int
    invisible_ms: int
    broker_name: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    serial: int

    @property
    def expires_ms(self) -> int:
        return self.retrieve_ms + self.invisible_ms

    def encode(self) -> str:
        fields = (
            self.start_offset, self.retrieve_ms, self.invisible_ms, 0, NORMAL_TOPIC, self.broker_name,
            self.queue_id, self.queue_offset, self.commit_log_offset, self.serial,
        )  # fmt: skip
        return " ".join(str(f) for f in fields)

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle:
        parts = text.split(" ")
        if len(parts) != _FIELDS:
            raise InvalidReceiptHandleError(f"receipt handle has {len(parts)} fields, expected {_FIELDS}")
        try:
            return cls(
                start_offset=int(parts[0]), retrieve_ms=int(parts[1]), invisible_ms=int(parts[2]),
                broker_name=parts[5], queue_id=int(parts[6]), queue_offset=int(parts[7]),
                commit_log_offset=int(parts[8]), serial=int(parts[9]),
            )  # fmt: skip
        except ValueError as exc:
            raise InvalidReceiptHandleError(f"malformed receipt handle {text!r}") from exc
