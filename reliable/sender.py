"""The one seam between `reliable` and a broker on the sending side.

The stub-first producer and the resend sweeper both hand an :class:`OutgoingMessage` to a :class:`Sender` and
record the :class:`SendReceipt` (through :mod:`reliable.outbox`). Adapters (broker_sim in-process or over TCP,
RocketMQ, RabbitMQ) implement it in a few lines; any exception from ``send`` means "not accepted" and leaves
the row PENDING for the sweeper. An adapter may also be a :class:`BrokerProbe`: the broker's own offsets are
what proves a message lost on a quiet queue (DESIGN.md §3).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """What a broker needs to deliver one stub. ``message_id`` should travel as the message *keys*.

    ``target_group=None``: a send to the topic (every subscribed group gets it). ``target_group="billing"``:
    the sweeper's targeted resend for that group only — RocketMQ/broker_sim send to ``%RETRY%billing`` with
    property ``RETRY_TOPIC=<topic>``, RabbitMQ publishes to that group's queue, a broker that cannot target
    (Kafka) sends to the topic and the other groups' guards absorb the duplicate.
    """

    message_id: str
    topic: str
    body: bytes
    tags: str | None = None
    #: 0 for the producer's first send, then 1, 2, … for each resend by the sweeper.
    send_count: int = 0
    properties: Mapping[str, str] = field(default_factory=dict)
    target_group: str | None = None


@dataclass(frozen=True, slots=True)
class SendReceipt:
    """Where the broker put the message: the sweeper compares ``queue_offset`` with the consumer watermark
    of the same queue, ``(topic, broker_name, queue_id)``."""

    queue_id: int
    queue_offset: int
    broker_message_id: str | None = None
    #: the RocketMQ broker group the send landed on; ``""``: the broker has no groups, or cannot tell
    broker_name: str = ""


@runtime_checkable
class Sender(Protocol):
    """Hands a message to a broker and returns where it landed; raises on any failure.

    A sender that cannot address one consumer group (a targeted message lands on the topic, where every
    group gets it) says so with a class attribute ``targets_groups = False``: the sweeper then sends one copy
    of a message for all its groups due in the same round instead of one each.
    """

    def send(self, message: OutgoingMessage) -> SendReceipt: ...


@runtime_checkable
class BrokerProbe(Protocol):
    """The broker's own view of a queue, which an adapter may implement next to :class:`Sender`.

    ``max_offset`` is one past the last stored message of the queue (RocketMQ *maxOffset*, Kafka high
    watermark); ``None`` when the broker cannot tell (unknown topic, broker unreachable). A stub whose offset
    is at or above it was lost by the broker. ``broker_name`` names the broker group of the queue on a
    RocketMQ cluster (ask that group's master, or its slave while the master is down); ``""``: the broker
    has no groups, or the position predates broker names (a probe may then answer only when exactly one
    group has that queue, else ``None``).
    """

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None: ...


@runtime_checkable
class RetentionProbe(Protocol):
    """The other end of a queue, which a :class:`BrokerProbe` may also tell: ``min_offset`` is the first
    offset the broker still stores (RocketMQ *minOffset*, Kafka's log start offset); ``None``: cannot tell.

    A broker deletes old segments by retention whether or not every group has read them, so a copy whose
    offset is below it is gone for a group that had not read it — on a quiet queue no watermark ever
    overtakes it and the max offset is above it, so without this answer the sweeper would hold it as
    queued for ever. Optional: a probe without it keeps the other rules.
    """

    def min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None: ...


@runtime_checkable
class AsyncSender(Protocol):
    """The asyncio flavour of :class:`Sender` (aio-pika, aiokafka): same message, same receipt, awaited."""

    def send(self, message: OutgoingMessage) -> Awaitable[SendReceipt]: ...
