"""What a staged message is and which names it may carry: the producer's vocabulary.

:class:`StagedMessage`, :class:`SendResult` and :class:`SendOutcome` are shared by the synchronous producer
(:mod:`reliable.producer`), the asyncio one (:mod:`reliable.aio_producer`) and their tests; the name checks
run at staging time, in the caller's transaction, so input no broker or column can carry fails there
instead of leaving a stub no send can ever deliver. :mod:`reliable.producer` re-exports all of it (its
public API is unchanged).
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from reliable import constants as C
from reliable.errors import InvalidMessageError
from reliable.models import mapping_from_json, mapping_json
from reliable.names import NAME_CHARS, NAME_RE, text_fault
from reliable.sender import OutgoingMessage, SendReceipt

log = logging.getLogger("reliable.producer")

#: The broker-neutral name language: RocketMQ's topic/group set (``Validators.PATTERN``) plus Kafka's '.'.
#: A sender whose broker accepts less says so with a ``name_pattern`` attribute (RocketMQ, broker_sim: no
#: '.'), checked at staging time so a name the broker will refuse fails in the caller's transaction instead
#: of leaving a stub no send can ever deliver.


class SendOutcome(enum.StrEnum):
    """What became of one staged message when the producer tried to send it."""

    SENT = "SENT"  # the broker accepted it; the receipt is recorded on the stub
    FAILED = "FAILED"  # the sender raised; the stub stays PENDING with last_error, due for the sweeper
    SKIPPED = "SKIPPED"  # no PENDING stub any more (voided, already confirmed, or never committed)
    DEFERRED = "DEFERRED"  # after-commit send not tried (a send just hung, reliable.send_breaker): sweeper's


@dataclass(frozen=True, slots=True)
class StagedMessage:
    """A stub written in the caller's transaction and not yet sent."""

    message_id: str
    topic: str
    body: bytes
    #: the consumer groups with a PENDING inbox row (each must process the message once)
    groups: tuple[str, ...]
    tags: str | None
    payload_hash: str
    properties: Mapping[str, str] = field(default_factory=dict)

    def outgoing(self, send_count: int = 0) -> OutgoingMessage:
        return OutgoingMessage(
            message_id=self.message_id,
            topic=self.topic,
            body=self.body,
            tags=self.tags,
            send_count=send_count,
            properties=self.properties,
        )


@dataclass(frozen=True, slots=True)
class SendResult:
    """The outcome of one send attempt, as recorded on the stub."""

    message_id: str
    outcome: SendOutcome
    receipt: SendReceipt | None = None
    error: str | None = None


def validate_message(message_id: str, topic: str, groups: Sequence[str], tags: str | None) -> None:
    """Raise :class:`InvalidMessageError` for input no broker adapter or table column can carry."""
    if not isinstance(message_id, str) or not message_id.strip():
        raise InvalidMessageError("message id must be a non-empty string")
    if len(message_id) > C.MESSAGE_ID_MAX:
        raise InvalidMessageError(
            f"message id longer than {C.MESSAGE_ID_MAX} characters: {message_id[:80]!r}"
        )
    fault = text_fault("message id", message_id) or _spacing_fault("message id", message_id)
    if fault is not None:
        raise InvalidMessageError(f"{fault}: {message_id[:80]!r}")
    _check_name("topic", topic, C.TOPIC_MAX)
    if topic.startswith(C.SYSTEM_TOPIC_PREFIXES):
        raise InvalidMessageError(f"topic {topic!r} is a broker's own (retry, dead-letter or system) topic")
    if not groups:
        raise InvalidMessageError(
            f"no consumer group for topic {topic!r}: pass groups=, or set topic_groups / default_group"
        )
    for group in groups:
        _check_name("consumer group", group, C.GROUP_MAX)
    if tags is None:
        return
    if not isinstance(tags, str):
        raise InvalidMessageError(f"tags must be a str or None, got {type(tags).__name__}")
    if len(tags) > C.TAGS_MAX or "||" in tags:
        raise InvalidMessageError(f"tags must be at most {C.TAGS_MAX} characters without '||': {tags[:80]!r}")
    fault = text_fault("tags", tags) or _control_fault("tags", tags)
    if fault is not None:
        raise InvalidMessageError(f"{fault}: {tags[:80]!r}")


def _control_fault(what: str, value: str) -> str | None:
    """A control character: RocketMQ joins a message's properties with ``\\x01`` and ``\\x02``, so tags
    ``t\\x02KEYS\\x01victim`` were delivered as message ``victim``."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return f"{what} contains a control character"
    return None


def _spacing_fault(what: str, value: str) -> str | None:
    """Whitespace or a control character: RocketMQ's ``KEYS`` property separates keys with spaces, so ids
    ``order 1`` and ``order 2`` were both delivered as message ``order`` — the second a duplicate, never
    applied."""
    if any(c.isspace() for c in value):
        return f"{what} contains whitespace"
    return _control_fault(what, value)


def _check_name(what: str, value: str, limit: int) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidMessageError(f"{what} must be a non-empty string")
    if len(value) > limit:
        raise InvalidMessageError(f"{what} longer than {limit} characters: {value[:80]!r}")
    if not NAME_RE.match(value):
        raise InvalidMessageError(f"{what} {value!r} may only contain {NAME_CHARS}")


def check_broker_names(sender: object, topic: str, groups: Sequence[str]) -> None:
    """Refuse names the sender's broker cannot carry (its optional ``name_pattern``)."""
    pattern = getattr(sender, "name_pattern", None)
    if not isinstance(pattern, re.Pattern):
        return
    for what, name in (("topic", topic), *(("consumer group", g) for g in groups)):
        if not pattern.match(name):
            raise InvalidMessageError(
                f"{what} {name!r} is not a valid name for {type(sender).__name__} "
                f"(must match {pattern.pattern})"
            )


def check_broker_limits(
    sender: object, message_id: str, tags: str | None, body: bytes, properties: Mapping[str, str]
) -> None:
    """Refuse what the sender's broker refuses at every send — a body over its ``max_body_bytes``, an id,
    tags or property name over its ``short_string_bytes`` (AMQP counts bytes, not characters) — while the
    caller's transaction can still fail: accepted, such a message committed with the business write, every
    send failed, and a person heard of it only when the sweeper gave up."""
    limit = getattr(sender, "max_body_bytes", None)
    if isinstance(limit, int) and len(body) > limit:
        raise InvalidMessageError(
            f"body of {len(body)} bytes: {type(sender).__name__}'s broker takes at most {limit}"
        )
    short = getattr(sender, "short_string_bytes", None)
    if not isinstance(short, int):
        return
    for what, value in (
        ("message id", message_id),
        ("tags", tags or ""),
        *(("property name", k) for k in properties),
    ):
        size = len(value.encode("utf-8"))
        if size > short:
            raise InvalidMessageError(
                f"{what} {value[:40]!r} is {size} bytes in UTF-8: "
                f"{type(sender).__name__}'s broker takes at most {short}"
            )


#: RocketMQ's delay-level property (4.x clients and broker_sim): the broker holds the message back
DELAY_PROPERTY = "DELAY"
#: the FIFO message group of a message (RocketMQ 5.x): the 5.x sender sends it as the message's own message
#: group (a system field, so a FIFO consumer group applies the group's messages in order), the stub keeps it
#: so a resend lands in the same message group; to other brokers it is an ordinary property
MESSAGE_GROUP_PROPERTY = "MESSAGE_GROUP"


def checked_properties(properties: Mapping[str, str] | None) -> dict[str, str]:
    """The message properties as the stub stores them, or :class:`InvalidMessageError` for what no broker
    header can carry as text."""
    if properties is None:
        return {}
    if not isinstance(properties, Mapping):
        raise InvalidMessageError(
            f"properties must be a mapping of str to str, got {type(properties).__name__}"
        )
    for key, value in properties.items():
        if not isinstance(key, str) or not isinstance(value, str) or not key:
            raise InvalidMessageError(f"property {key!r}: names and values must be non-empty str / str")
        fault = text_fault(f"property {key!r}", key + value)
        if fault is None and ("\x01" in key + value or "\x02" in key + value):
            fault = f"property {key!r} contains RocketMQ's property separators (\\x01 or \\x02)"
        if fault is not None:
            raise InvalidMessageError(fault)
        if key in C.RESERVED_PROPERTIES or key.startswith(C.RESERVED_PROPERTY_PREFIXES):
            raise InvalidMessageError(
                f"property {key!r} is reserved (a broker's own, or under a prefix reliable's adapters write:"
                f" {', '.join(C.RESERVED_PROPERTY_PREFIXES)})"
            )
    if MESSAGE_GROUP_PROPERTY in properties and DELAY_PROPERTY in properties:
        # a 5.x message is FIFO or delayed, never both: the client refuses every send of such a stub
        raise InvalidMessageError(
            f"properties {MESSAGE_GROUP_PROPERTY} and {DELAY_PROPERTY}: a FIFO message cannot be delayed"
        )
    return dict(properties)


def properties_json(properties: Mapping[str, str]) -> str | None:
    """What ``message_stub.properties`` stores (``None``: none)."""
    return mapping_json(properties)


def held_back_s(properties: Mapping[str, str]) -> float:
    """How long the broker holds the message before any consumer can see it: the ``DELAY`` level's delay
    (RocketMQ's default table, as the broker applies it: a level above the last is the last, 0 or less is
    none). The sweeper must not look for the message before then."""
    level = properties.get(DELAY_PROPERTY)
    if level is None:
        return 0.0
    try:
        n = int(level)
    except ValueError:
        raise InvalidMessageError(
            f"property {DELAY_PROPERTY} must be a delay level (an integer), got {level!r}"
        ) from None
    levels = C.ROCKETMQ_DELAY_LEVELS_S
    return 0.0 if n <= 0 else float(levels[min(n, len(levels)) - 1])


def stored_properties(text: str | None) -> dict[str, str]:
    """The properties a stub stored (:func:`properties_json`), for a resend."""
    return mapping_from_json(text, "properties", log, "the resend carries none")
