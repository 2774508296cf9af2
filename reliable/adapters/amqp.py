"""What the RabbitMQ adapters decide, without any client library: header names, envelope mapping, routing.

The blocking ``pika`` adapter (:mod:`reliable.adapters.rabbitmq`), the asyncio ``aio-pika`` adapter
(:mod:`reliable.adapters.rabbitmq_aio`) and the FastStream integration all map a delivery to an
:class:`~reliable.types.Envelope`, a guarded result to an AMQP answer, and a dead letter to a copy carrying
its reason with *these* functions, so the three cannot drift apart. Only their I/O (blocking calls, awaits)
is their own. The mapping rules are documented on :mod:`reliable.adapters.rabbitmq`.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from reliable import constants as C
from reliable.errors import ConfigurationError
from reliable.sender import OutgoingMessage
from reliable.types import ConsumeResult, Envelope

log = logging.getLogger("reliable.adapters.rabbitmq")

HEADER_TOPIC = "x-reliable-topic"
HEADER_GROUP = "x-reliable-group"
HEADER_TAGS = "x-reliable-tags"
HEADER_SEQ = "x-reliable-seq"
HEADER_SEND_COUNT = "x-reliable-send-count"
HEADER_DEAD_REASON = "x-reliable-dead-reason"
HEADER_ORIGINAL_QUEUE = "x-reliable-original-queue"
HEADER_ORIGINAL_MESSAGE_ID = "x-reliable-original-message-id"
ID_HEADERS = ("message-id", "x-message-id")
DELIVERY_COUNT = "x-delivery-count"
REASON_MAX = 1000
PERSISTENT = 2  # AMQP delivery_mode of a message written to disk
CONTENT_TYPE = "application/octet-stream"

#: the last number :func:`next_seq` gave out in this process (every sender, sync and async, shares it)
_last_seq = 0
_seq_lock = threading.Lock()


def next_seq() -> int:
    """A send's position, where a queue has none: the sending time in microseconds since the epoch, raised to
    one past the last number where the clock has not moved on (or went back).

    Why a clock and not a counter: the sweeper compares a copy's number with the highest number its group has
    received (the watermark). A per-process counter restarted at 1 in every process, so with two producer
    replicas, or after a restart, a copy queued behind a paused group compared as "already passed" in every
    round: it was re-sent until its budget was spent and a person was told about a message that was never
    missing. Clock numbers never repeat in a process and compare across processes as far as their clocks
    agree (a few milliseconds under NTP); a resend gets a new, later number, so it is never "passed" before
    the group has really moved past it.

    Never below ``AMQP_CLOCK_POSITION_MIN`` (a host clock at 1970 included): that is how the reconciliation
    report tells a RabbitMQ queue's clock positions from a broker's offsets (no gaps, no lag from them).
    """
    global _last_seq
    with _seq_lock:
        _last_seq = max(_last_seq + 1, time.time_ns() // 1000, C.AMQP_CLOCK_POSITION_MIN)
        return _last_seq


class Action(enum.Enum):
    """What the consumer does with a delivery once the guard has answered."""

    ACK = "ack"
    REQUEUE = "requeue"  # basic.nack(requeue=True), after the retry delay (requeue_delay_s)
    DEAD_LETTER = "dead_letter"  # a copy with the reason to the DLX (confirmed), then basic.ack


def action_for(result: ConsumeResult) -> Action:
    if result is ConsumeResult.SUCCESS:
        return Action.ACK
    if result is ConsumeResult.RECONSUME_LATER:
        return Action.REQUEUE
    return Action.DEAD_LETTER


class HasResult(Protocol):
    """A guard ``Decision``: the result plus why."""

    @property
    def result(self) -> ConsumeResult: ...


def result_of(answer: ConsumeResult | HasResult) -> ConsumeResult:
    return answer if isinstance(answer, ConsumeResult) else answer.result


def requeue_delay_s(answer: object, retry_delay_s: float, reconsume_times: int = 0) -> float:
    """How long a delivery answered ``RECONSUME_LATER`` is held unacked before ``nack(requeue=True)``:
    ``retry_delay_s``; on a lease conflict ``retry_delay_s × 2^reconsume_times``, no longer than the other
    worker's lease can still run (the guard's ``Decision.retry_after_ms``, at most one lease).

    Why: a lease a killed worker left lives up to ``lease_ms`` (60 s by default). Requeued every
    ``retry_delay_s`` meanwhile, each redelivery counted against a quorum queue's ``x-delivery-limit``
    (RabbitMQ 4's default: 20), and the broker dead-lettered the message itself — no reason, the handler
    never run, the inbox row PENDING until the sweeper's stuck rule. Doubling the hold with the queue's
    delivery count spends about log2(lease ÷ retry delay) deliveries on a dead worker's lease (6 for the
    defaults). Redis cannot tell a live worker's lease from a dead one's (both read as most of a minute to
    go), so a twin delivered beside a live worker is held the same way: ``retry_delay_s`` on a message's
    first delivery, longer on one already delivered several times (by failures or conflicts) — up to the
    lease's end. A classic queue counts no deliveries: its redeliveries wait ``2 × retry_delay_s``."""
    wait_ms = getattr(answer, "retry_after_ms", None)
    if isinstance(wait_ms, int) and wait_ms > 0:
        backoff_s = retry_delay_s * float(2 ** min(max(reconsume_times, 0), 30))
        return max(retry_delay_s, min(backoff_s, wait_ms / 1000))
    return retry_delay_s


def dead_reason(answer: object, env: Envelope) -> str:
    """The dead-letter reason: the guard decision's reason and detail when we have them."""
    reason = getattr(answer, "reason", None)
    detail = getattr(answer, "detail", None)
    if reason is not None:
        text = f"{reason}: {detail}" if detail else str(reason)
    elif not env.message_id:
        text = "missing message id"
    else:
        text = "handler answered DEAD_LETTER"
    return text[:REASON_MAX]


@dataclass(frozen=True, slots=True)
class Settlement:
    """How to answer the broker for one guarded delivery (:func:`settlement`); answering is the adapter's."""

    action: Action
    #: ``REQUEUE``: how long the delivery is held unacked before ``nack(requeue=True)``
    delay_s: float = 0.0
    #: ``DEAD_LETTER``: what the copy's ``x-reliable-dead-reason`` header says
    reason: str = ""


def settlement(answer: ConsumeResult | HasResult, env: Envelope, retry_delay_s: float) -> Settlement:
    """The guard's ``answer`` for ``env`` as an AMQP answer (:func:`action_for`, :func:`requeue_delay_s`,
    :func:`dead_reason`)."""
    action = action_for(result_of(answer))
    if action is Action.REQUEUE:
        return Settlement(action, delay_s=requeue_delay_s(answer, retry_delay_s, env.reconsume_times))
    if action is Action.DEAD_LETTER:
        return Settlement(action, reason=dead_reason(answer, env))
    return Settlement(action)


def check_consumer_options(prefetch: int, retry_delay_s: float) -> None:
    """Raise :class:`ConfigurationError` for options no consumer can run with."""
    if prefetch <= 0 or retry_delay_s < 0:
        raise ConfigurationError("prefetch must be > 0 and retry_delay_s >= 0")


_Handler = TypeVar("_Handler")


def decider(handler: _Handler) -> _Handler:
    """What a consumer calls per delivery: ``handler.decide`` where offered (``@idempotent_consumer``
    handlers: the same call, plus the reason a dead letter's header should carry), else ``handler``."""
    decide = getattr(handler, "decide", None)
    return cast(_Handler, decide) if callable(decide) else handler


@dataclass(frozen=True, slots=True)
class Topology:
    """The names the adapters declare for one consumer queue (``{queue}.dlx`` → ``{queue}.dlq``)."""

    queue: str
    #: an exchange to bind ``queue`` to (``None``: publishers use the default exchange and the queue name)
    exchange: str | None = None
    binding_key: str | None = None
    exchange_type: str = "direct"
    queue_type: str = "classic"
    queue_arguments: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.queue}.dlx"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.queue}.dlq"

    @property
    def routing_key(self) -> str:
        """The binding of ``queue`` to ``exchange`` (and of the DLQ to the DLX)."""
        return self.binding_key or self.queue

    def declared_arguments(self) -> dict[str, Any]:
        """The queue's arguments: its type and the broker's own dead-lettering (the fallback path)."""
        return {
            "x-queue-type": self.queue_type,
            "x-dead-letter-exchange": self.dead_letter_exchange,
            "x-dead-letter-routing-key": self.queue,
            **self.queue_arguments,
        }


#: what a client hands over for an AMQP byte string: pika gives ``bytes``, aio-pika (pamqp) decodes a
#: byte-array field (``x``) as ``bytearray``; all are the same bytes and are read alike
BINARY = (bytes, bytearray, memoryview)


def text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, BINARY):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def ident(value: Any) -> str:
    """An id or topic header as text. Bytes that are not UTF-8 keep their difference as lone surrogates
    (``surrogateescape``), which the guard dead-letters as bad input: decoded with replacement characters,
    ``hX\\xff`` and ``hX\\xfe`` were one id, and the second message was acknowledged as the first's duplicate,
    its handler never run. A ``bytearray`` (aio-pika's byte-array header) is bytes too: read with ``str()``
    it became the id ``"bytearray(b'…')"``, so a resend of the same message under its real id applied the
    effect a second time, and a non-UTF-8 id was processed instead of dead-lettered."""
    if isinstance(value, BINARY):
        return bytes(value).decode("utf-8", "surrogateescape")
    return text(value)


def envelope_from(
    *,
    message_id: str | bytes | None,
    headers: Mapping[str, Any] | None,
    exchange: str | None,
    routing_key: str | None,
    redelivered: bool,
    delivery_tag: int,
    type_: str | None,
    body: bytes,
    default_topic: str | None = None,
) -> Envelope:
    """The broker-neutral view of one delivery, from the AMQP fields every client exposes."""
    hdrs: dict[str, Any] = dict(headers or {})
    if HEADER_ORIGINAL_MESSAGE_ID in hdrs:  # a dead-letter copy: its own property may be a client's invention
        message_id = hdrs[HEADER_ORIGINAL_MESSAGE_ID]
    # pika hands an AMQP short string that is not UTF-8 over as bytes
    mid = ident(message_id) if message_id else next((ident(hdrs[h]) for h in ID_HEADERS if hdrs.get(h)), None)
    topic = ident(hdrs.get(HEADER_TOPIC)) or default_topic or routing_key or ""
    reconsume = delivery_count(hdrs.get(DELIVERY_COUNT), redelivered)
    offset = position(hdrs.get(HEADER_SEQ), delivery_tag, message_id=mid)
    properties = {k: text(v) for k, v in hdrs.items() if isinstance(v, (str, int, float, *BINARY))}
    properties |= {
        "amqp.exchange": exchange or "",
        "amqp.routing_key": routing_key or "",
        "amqp.redelivered": str(bool(redelivered)).lower(),
    }
    return Envelope(
        message_id=mid or None,
        topic=topic,
        queue_id=0,
        queue_offset=offset,
        body=bytes(body),
        keys=mid or None,
        tags=text(hdrs.get(HEADER_TAGS)) or type_ or None,
        reconsume_times=reconsume,
        properties=properties,
    )


def position(seq: Any, delivery_tag: int, *, message_id: str | None = None) -> int:
    """The delivery's ``queue_offset``: the sender's ``x-reliable-seq``, else the delivery tag. A number
    further ahead of this process's clock than ``AMQP_SEQ_MAX_AHEAD_S`` is not a sender's clock (a foreign
    publisher's nanoseconds, a producer host whose clock runs ahead): taken as the position it raised the
    group's watermark above every real send for good, and the sweeper then judged messages queued behind a
    paused group as passed — re-sent, then DEAD, a person told of messages that were never missing."""
    if not isinstance(seq, int) or isinstance(seq, bool):
        return int(delivery_tag)
    if seq > time.time_ns() // 1000 + C.AMQP_SEQ_MAX_AHEAD_S * 1_000_000:
        log.warning(
            "message %s: x-reliable-seq %d is more than %d s ahead of this clock; not taken as its position",
            message_id,
            seq,
            C.AMQP_SEQ_MAX_AHEAD_S,
        )
        return int(delivery_tag)
    return int(seq)


def delivery_count(value: Any, redelivered: bool) -> int:
    """The delivery's reconsume count: quorum queues' ``x-delivery-count`` when it is a count, else 1 for a
    redelivery and 0 otherwise. Any publisher can set that header on a classic queue, to anything: a value
    that is not a count must not stop the consumer, so it is ignored (the message is still processed)."""
    if isinstance(value, (str, *BINARY)):
        try:
            value = int(text(value))
        except ValueError:
            value = None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return 1 if redelivered else 0


def dead_letter_headers(
    headers: Mapping[str, Any] | None, reason: str, queue: str, message_id: Any = None
) -> dict[str, Any]:
    """The headers of a dead-lettered copy: the original ones plus why, from where, and the original's
    ``message_id`` property (``""`` when it had none), which the envelope of a replayed copy takes instead of
    the copy's own property.

    Why the id travels in a header: aiormq stamps a random ``message_id`` on every publish without one, so
    the copy of a message that had no id carried an id nobody sent, and a replay of the dead-letter queue
    processed it under that id. A copy dead-lettered again keeps the first original's value."""
    out = dict(headers or {})
    out[HEADER_DEAD_REASON] = reason[:REASON_MAX]
    out[HEADER_ORIGINAL_QUEUE] = queue
    if HEADER_ORIGINAL_MESSAGE_ID not in out:
        out[HEADER_ORIGINAL_MESSAGE_ID] = (
            bytes(message_id) if isinstance(message_id, BINARY) else message_id or ""
        )
    return out


GroupQueue = Callable[[str, str], str]


def default_group_queue(topic: str, group: str) -> str:
    """Where a resend targeted at one group goes unless told otherwise: the queue named after the group."""
    return group


def destination(
    message: OutgoingMessage, exchange: str, routing_key: str, group_queue: GroupQueue
) -> tuple[str, str]:
    """``(exchange, routing key)`` of a send: the topic's route, or — for the sweeper's resend targeted at one
    group (``message.target_group``) — straight into that group's queue through the default exchange."""
    if message.target_group:
        return "", group_queue(message.topic, message.target_group)
    return exchange, routing_key


def unroutable_hint(message: OutgoingMessage, queue: str) -> str:
    """What to add to the error of a send the broker returned unroutable: for the sweeper's resend targeted at
    one group, the likely cause — the queue ``group_queue`` named does not exist. By default that queue is the
    group's bare name, while the guide's topology names it ``billing.orders``: every targeted resend came back
    unroutable, and the error said only "no queue bound"."""
    if not message.target_group:
        return ""
    return (
        f"; the resend for group {message.target_group!r} went to queue {queue!r} (default exchange), which "
        f"does not exist — set {C.ENV_RABBITMQ_GROUP_QUEUE} (the sender's group_queue) to the format of "
        "the group's queue name, e.g. '{group}.{topic}'"
    )


#: the AMQP properties a dead-lettered copy keeps (the names pika's ``BasicProperties`` and aio-pika's
#: ``Message`` both take as keyword arguments)
_KEPT_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "message_id", "timestamp", "type")


def dead_letter_properties(original: Any, reason: str, queue: str) -> dict[str, Any]:
    """The properties of the persistent dead-lettered copy of ``original`` (its properties or message)."""
    kept = {name: getattr(original, name, None) for name in _KEPT_PROPERTIES}
    headers = dead_letter_headers(getattr(original, "headers", None), reason, queue, kept["message_id"])
    return {**kept, "headers": headers, "delivery_mode": PERSISTENT}


@dataclass(frozen=True, slots=True)
class Publication:
    """Everything a sender puts on the wire for one :class:`OutgoingMessage` (client-independent)."""

    routing_key: str
    headers: dict[str, Any]
    message_id: str
    type_: str | None
    timestamp: int
    seq: int


def publication(message: OutgoingMessage, routing_key: str) -> Publication:
    """Stamp ``message`` with the headers the consumer side reads back (topic, tags, sequence, send count)."""
    seq = next_seq()
    headers: dict[str, Any] = dict(message.properties)
    headers |= {HEADER_TOPIC: message.topic, HEADER_SEQ: seq, HEADER_SEND_COUNT: message.send_count}
    if message.target_group:
        headers[HEADER_GROUP] = message.target_group
    if message.tags:
        headers[HEADER_TAGS] = message.tags
    return Publication(routing_key, headers, message.message_id, message.tags, int(time.time()), seq)
