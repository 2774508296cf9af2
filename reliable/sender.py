"""The one seam between `reliable` and a broker on the sending side.

The stub-first producer and the resend sweeper both hand an :class:`OutgoingMessage` to a :class:`Sender` and
record the :class:`SendReceipt`. Adapters (broker_sim in-process or over TCP, RocketMQ, RabbitMQ) implement it
in a few lines; any exception from ``send`` means "not accepted" and leaves the stub PENDING for the sweeper.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """What a broker needs to deliver one stub. ``message_id`` should travel as the message *keys*."""

    message_id: str
    topic: str
    body: bytes
    consumer_group: str
    tags: str | None = None
    #: 0 for the producer's first send, then 1, 2, … for each resend by the sweeper.
    send_count: int = 0
    properties: Mapping[str, str] = field(default_factory=dict)
    #: None: to the topic (every subscribed group); a group name: a resend for that group only (contracts.md)
    target_group: str | None = None


@dataclass(frozen=True, slots=True)
class SendReceipt:
    """Where the broker put the message: the sweeper compares ``queue_offset`` with the consumer watermark."""

    queue_id: int
    queue_offset: int
    broker_message_id: str | None = None


@runtime_checkable
class Sender(Protocol):
    """Hands a message to a broker and returns where it landed; raises on any failure."""

    def send(self, message: OutgoingMessage) -> SendReceipt: ...


@runtime_checkable
class BrokerProbe(Protocol):
    """The loss probe: one past the last stored message of a queue; None = cannot tell (contracts.md)."""

    def max_offset(self, topic: str, queue_id: int) -> int | None: ...
