"""Kafka logic that does not depend on a client library: header codec, message id, retry routing.

The synchronous adapter (:mod:`reliable.adapters.kafka`, on ``confluent-kafka``) and an asyncio one (on
``aiokafka``) see the same records through different client objects. Everything that decides *what* to do
with a record lives here, over the neutral :class:`Record`, so the two flavours share it instead of copying
it: how headers decode, where the message id comes from, what a delivery's :class:`Envelope` is, and where a
record goes after ``RECONSUME_LATER`` or ``DEAD_LETTER`` (:class:`RetryPolicy`, :func:`forward_headers`; the
per-answer decision built on them is :mod:`reliable.adapters.kafka_steps`).

Kafka headers are ``(name, bytes | None)`` pairs; a name may repeat. The adapter reads them as UTF-8 text,
last value wins; a header value that is not UTF-8 makes the record undecodable (:class:`UndecodableRecord`),
which the consumer dead-letters with the reason rather than guessing.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from reliable import constants as C
from reliable.errors import ConfigurationError
from reliable.sender import OutgoingMessage
from reliable.types import Envelope

log = logging.getLogger("reliable.adapters.kafka")

RawHeaders = Sequence[tuple[str, str | bytes | None]]


class UndecodableRecord(ValueError):
    """A record whose headers or key cannot be read: it goes to the dead-letter topic with this reason."""


class IdSource(enum.Enum):
    """Where a record's message id came from."""

    HEADER = "header"
    KEY = "key"
    POSITION = "position"  # topic-partition-offset of the first delivery: producer retries look new
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Record:
    """One consumed record, as every Kafka client library can describe it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: RawHeaders = ()
    timestamp_ms: int | None = None


def decode_headers(raw: RawHeaders | None) -> dict[str, str]:
    """Headers as text (last value of a repeated name wins; a null value is an empty string).

    Raises :class:`UndecodableRecord` for a value that is not UTF-8.
    """
    out: dict[str, str] = {}
    for name, value in raw or ():
        if value is None:
            out[name] = ""
        elif isinstance(value, str):
            out[name] = value
        else:
            try:
                out[name] = bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UndecodableRecord(
                    f"header {name!r} is not UTF-8 ({exc.reason} at byte {exc.start})"
                ) from None
    return out


def encode_headers(headers: Mapping[str, str]) -> list[tuple[str, str | bytes | None]]:
    """The wire form of text headers (UTF-8), in a stable order."""
    return [(name, value.encode("utf-8")) for name, value in headers.items()]


def position_id(topic: str, partition: int, offset: int) -> str:
    """The id of last resort: where the record first landed."""
    return f"{topic}-{partition}-{offset}"


def message_id(
    record: Record, headers: Mapping[str, str], id_header: str, allow_position: bool
) -> tuple[str | None, IdSource]:
    """The business message id: header ``id_header``, else the key, else the record's first position.

    A retry or dead-letter copy carries the id of the original in ``id_header`` (see
    :func:`forward_headers`), so every hop of one record has the same id whatever source it came from.
    ``allow_position=False`` returns ``(None, IdSource.NONE)`` instead of the positional fallback (the guard
    then dead-letters the record as having no id).
    """
    value = headers.get(id_header)
    if value:
        return value, IdSource.HEADER
    if record.key:
        try:
            return bytes(record.key).decode("utf-8"), IdSource.KEY
        except UnicodeDecodeError:
            log.warning(
                "%s-%d@%d: key is not UTF-8, not usable as message id",
                record.topic,
                record.partition,
                record.offset,
            )
    if not allow_position:
        return None, IdSource.NONE
    origin = Origin.of(record, headers)
    return position_id(origin.topic, origin.partition, origin.offset), IdSource.POSITION


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a record was first produced, and how many times it has failed so far."""

    topic: str
    partition: int
    offset: int
    attempt: int  # handler failures before this delivery (0: the first delivery)

    @classmethod
    def of(cls, record: Record, headers: Mapping[str, str]) -> Origin:
        """The original position from the forwarding headers, or the record's own when it has none."""
        topic = headers.get(C.KAFKA_HEADER_ORIGINAL_TOPIC)
        if not topic:
            return cls(record.topic, record.partition, record.offset, 0)
        try:
            return cls(
                topic,
                int(headers[C.KAFKA_HEADER_ORIGINAL_PARTITION]),
                int(headers[C.KAFKA_HEADER_ORIGINAL_OFFSET]),
                int(headers.get(C.KAFKA_HEADER_ATTEMPT, "0")),
            )
        except (KeyError, ValueError) as exc:
            raise UndecodableRecord(f"forwarding headers incomplete or not numeric: {exc}") from None


def to_envelope(
    record: Record, *, id_header: str = C.KAFKA_ID_HEADER, allow_position_id: bool = True
) -> Envelope:
    """The broker-neutral view of one record (raises :class:`UndecodableRecord`).

    ``topic`` is the original (business) topic, ``delivered_topic`` the retry topic when this is a retry
    delivery; ``queue_id``/``queue_offset`` are this delivery's partition and offset; ``reconsume_times`` the
    number of handler failures before it.
    """
    headers = decode_headers(record.headers)
    origin = Origin.of(record, headers)
    mid, source = message_id(record, headers, id_header, allow_position_id)
    if source is IdSource.POSITION:
        log.warning(
            "%s-%d@%d has no %r header and no key: using %s as its message id, so a producer retry of it "
            "will look like a new message",
            record.topic,
            record.partition,
            record.offset,
            id_header,
            mid,
        )
    properties = dict(headers)
    properties.pop(C.KAFKA_COMMIT_FLOOR_PROPERTY, None)  # the loop's to set, never a producer's
    properties["kafka.id_source"] = source.value
    if record.timestamp_ms is not None:
        properties["kafka.timestamp_ms"] = str(record.timestamp_ms)
    return Envelope(
        message_id=mid,
        topic=origin.topic,
        queue_id=record.partition,
        queue_offset=record.offset,
        body=bytes(record.value or b""),
        keys=mid,
        tags=headers.get(C.KAFKA_HEADER_TAGS) or None,
        reconsume_times=origin.attempt,
        properties=properties,
        delivered_topic=None if record.topic == origin.topic else record.topic,
        target_group=headers.get(C.KAFKA_HEADER_TARGET_GROUP) or None,
    )


#: guard reasons (``Decision.reason`` values) that are not the record's fault — another worker holds its
#: lease, the database is down, a concurrent confirm — so the consumer waits and retries in place instead of
#: moving the record towards the dead-letter topic
HOLD_REASONS = frozenset({"lease_conflict", "database_unavailable", "confirm_conflict"})


class RetryMode(enum.Enum):
    """What ``RECONSUME_LATER`` does."""

    TOPICS = (
        "topics"  # forward to {topic}.retry.{n}; the partition moves on (order of failed records is lost)
    )
    BLOCKING = "blocking"  # pause the partition, seek back, redeliver after the delay (order kept)


@dataclass(frozen=True, slots=True)
class Hop:
    """Where a failed record goes next: ``topic`` (a retry topic or the DLT), due ``delay_s`` from now."""

    topic: str
    delay_s: float
    dead: bool


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Growing delays, one retry topic per delay, then the dead-letter topic."""

    delays_s: tuple[float, ...] = C.KAFKA_DEFAULT_RETRY_DELAYS_S
    mode: RetryMode = RetryMode.TOPICS
    #: ``None``: ``{topic}.retry.{n}`` / ``{topic}.dlt``. With several consumer groups on one topic give each
    #: its own scope (``"billing"`` → ``{topic}.billing.retry.{n}``), or every group also reads the others'
    #: retry copies, which the loops commit past unhandled (each names its group: ``reliable-retry-group``).
    scope: str | None = None

    def __post_init__(self) -> None:
        if any(d < 0 for d in self.delays_s):
            raise ConfigurationError(f"retry delays must be >= 0, got {self.delays_s}")

    def _base(self, topic: str) -> str:
        return f"{topic}.{self.scope}" if self.scope else topic

    def retry_topic(self, topic: str, n: int) -> str:
        return C.KAFKA_RETRY_TOPIC_FORMAT.format(topic=self._base(topic), n=n)

    def dlt_topic(self, topic: str) -> str:
        return C.KAFKA_DLT_TOPIC_FORMAT.format(topic=self._base(topic))

    def topics(self, topic: str) -> list[str]:
        """What a consumer of ``topic`` subscribes to: the topic and its retry topics (non-blocking mode)."""
        if self.mode is RetryMode.BLOCKING:
            return [topic]
        return [topic, *(self.retry_topic(topic, n) for n in range(1, len(self.delays_s) + 1))]

    def all_topics(self, topic: str) -> list[str]:
        """Every topic the policy may write to or read from (to create them up front)."""
        return [*self.topics(topic), self.dlt_topic(topic)]

    def after_failure(self, topic: str, attempt: int) -> Hop:
        """The hop after the ``attempt``-th handler failure (1 = the first delivery failed)."""
        if attempt <= len(self.delays_s):
            return Hop(self.retry_topic(topic, attempt), self.delays_s[attempt - 1], dead=False)
        return Hop(self.dlt_topic(topic), 0.0, dead=True)


def last_attempt(env: Envelope, policy: RetryPolicy, failed_before: int = 0) -> Envelope:
    """``env`` marked :attr:`~reliable.types.Envelope.last_attempt` when a handler failure now would send the
    record to the dead-letter topic: the guard then gives up too — the group's row DEAD and a person told —
    instead of leaving it PENDING for the sweeper to re-drive the whole retry chain. Topics mode counts by the
    record's own attempt header; blocking mode by ``failed_before``, the handler failures of the partition's
    head so far (the loop passes it for the head only: the records behind it have failed nowhere yet). Until
    2026-11-28 blocking mode never marked it: a give-up left the row PENDING, with no producer stub nobody
    was told, and with one the sweeper re-sent the record through the whole chain ``max_sends`` times."""
    if policy.mode is RetryMode.TOPICS:
        dead = policy.after_failure(env.topic, env.reconsume_times + 1).dead
    else:
        dead = failed_before + 1 > len(policy.delays_s)
    return replace(env, last_attempt=True) if dead else env


def forwarded_by_another_group(
    record: Record, headers: Mapping[str, str], group: str, policy: RetryPolicy
) -> bool:
    """A retry copy that another consumer group forwarded (an unscoped retry topic is read by every group):
    not ``group``'s to handle — it has the message from the topic itself. Only a copy still on one of the
    policy's retry topics of the topic it names: a dead-letter copy replayed onto the original topic is
    everyone's again, and so is any record that merely carries the headers — a handler that copied a retry
    delivery's headers into a follow-up message on another topic had every copy of it dropped unjournaled
    (until 2026-11-28)."""
    forwarder = headers.get(C.KAFKA_HEADER_RETRY_GROUP)
    original = headers.get(C.KAFKA_HEADER_ORIGINAL_TOPIC)
    if not forwarder or forwarder == group or original is None or original == record.topic:
        return False
    return record.topic in policy.topics(original)[1:]


def forward_headers(
    record: Record,
    headers: Mapping[str, str],
    env: Envelope,
    *,
    attempt: int,
    reason: str,
    delay_s: float,
    id_header: str = C.KAFKA_ID_HEADER,
    now_s: float | None = None,
    group: str | None = None,
) -> dict[str, str]:
    """Headers of the copy sent to a retry topic or the DLT: the original's plus where it came from and why.

    ``attempt`` counts handler failures so far; ``reason`` is at most 1000 characters; ``group`` is the
    consumer group that forwards it (``reliable-retry-group``).
    """
    origin = Origin.of(record, headers)
    now = time.time() if now_s is None else now_s
    out = dict(headers)
    if env.message_id:
        out[id_header] = env.message_id
    out |= {
        C.KAFKA_HEADER_ORIGINAL_TOPIC: origin.topic,
        C.KAFKA_HEADER_ORIGINAL_PARTITION: str(origin.partition),
        C.KAFKA_HEADER_ORIGINAL_OFFSET: str(origin.offset),
        C.KAFKA_HEADER_ATTEMPT: str(attempt),
        C.KAFKA_HEADER_REASON: reason[:1000],
        C.KAFKA_HEADER_NOT_BEFORE: str(int((now + delay_s) * 1000)),
    }
    if group:
        out[C.KAFKA_HEADER_RETRY_GROUP] = group
    return out


def raw_forward_headers(record: Record, reason: str) -> list[tuple[str, str | bytes | None]]:
    """Headers for the dead-letter copy of an undecodable record: its own bytes untouched, plus the reason."""
    extra = {
        C.KAFKA_HEADER_ORIGINAL_TOPIC: record.topic,
        C.KAFKA_HEADER_ORIGINAL_PARTITION: str(record.partition),
        C.KAFKA_HEADER_ORIGINAL_OFFSET: str(record.offset),
        C.KAFKA_HEADER_REASON: reason[:1000],
    }
    kept = [
        (k, v.encode("utf-8") if isinstance(v, str) else v) for k, v in record.headers or () if k not in extra
    ]
    return [*kept, *encode_headers(extra)]


def due_in_s(
    record: Record, headers: Mapping[str, str], policy: RetryPolicy, now_s: float | None = None
) -> float:
    """Seconds until a retry copy is due (0 when due or not a retry copy), at most the policy's longest
    delay. Only a record on one of the policy's retry topics waits: one record on the business topic that
    carried a far-future ``reliable-not-before-ms`` (a relay that copied headers) paused its partition for
    days, the records behind it with it, and nothing was journaled (until 2026-11-28)."""
    raw = headers.get(C.KAFKA_HEADER_NOT_BEFORE)
    original = headers.get(C.KAFKA_HEADER_ORIGINAL_TOPIC)
    if not raw or original is None or record.topic not in policy.topics(original)[1:]:
        return 0.0
    try:
        due = int(raw) / 1000.0
    except ValueError:
        return 0.0
    wait = due - (time.time() if now_s is None else now_s)
    return min(max(0.0, wait), max(policy.delays_s, default=0.0))


def reason_of(answer: object, env: Envelope) -> str:
    """A dead-letter or retry reason: the guard decision's reason and detail when it has them."""
    reason = getattr(answer, "reason", None)
    detail = getattr(answer, "detail", None)
    if reason is not None:
        return f"{reason}: {detail}" if detail else str(reason)
    if not env.message_id:
        return "missing message id"
    return f"handler answered {getattr(answer, 'result', answer)}"


def send_headers(
    message: OutgoingMessage, id_header: str = C.KAFKA_ID_HEADER
) -> list[tuple[str, str | bytes | None]]:
    """The wire headers of a stub's send (both Senders): properties, id, send count, tags, target group."""
    headers = dict(message.properties)
    headers[id_header] = message.message_id
    headers[C.KAFKA_HEADER_SEND_COUNT] = str(message.send_count)
    if message.tags:
        headers[C.KAFKA_HEADER_TAGS] = message.tags
    if message.target_group:
        headers[C.KAFKA_HEADER_TARGET_GROUP] = message.target_group
    return encode_headers(headers)
