"""SQLAlchemy 2.0 models of the contract tables (DESIGN.md §1).

Fan-out is the normal case (several consumer groups on one topic), so the producer's record of a message
(``message_stub``, one row per message) and each group's processing state (``message_inbox``, one row per
``(consumer_group, message_id)``) are separate rows. Statuses of both use :class:`reliable.types.StubStatus`
(one vocabulary); the stub's status is derived from its inbox rows (see :mod:`reliable.outbox`).

Table and column names are a contract (the Spark job, DBAs and dashboards read them); change them only with a
migration and a note in ``docs/``. Every timestamp is UTC-aware in Python on every backend: PostgreSQL stores
``timestamptz``; SQLite and MariaDB store naive UTC with microseconds, and :class:`UTCDateTime` attaches the
zone on the way out and refuses naive datetimes on the way in (a naive value is a bug, not a local time).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Dialect,
    Enum,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Text,
    TypeDecorator,
    literal_column,
    text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.elements import ColumnElement

from reliable import constants as C
from reliable.types import LogOutcome, StubStatus

#: Deterministic constraint/index names, so migrations can drop what they created on every backend.
NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


def utcnow() -> dt.datetime:
    """The current time, UTC-aware. The single clock source of the SQL layer (tests may patch it)."""
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A timestamp that is UTC-aware in Python whatever the backend stores."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(DateTime(timezone=True))
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime())

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; use datetime.now(datetime.UTC)")
        value = value.astimezone(dt.UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


#: bodies up to RocketMQ's 4 MiB limit; MySQL's plain BLOB stops at 64 KiB.
Body = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
#: SQLite only auto-increments an ``INTEGER PRIMARY KEY``.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def _broker_name(*, primary_key: bool = False) -> Mapped[str]:
    """``broker_name VARCHAR(64) NOT NULL DEFAULT ''`` (migration 0006): the RocketMQ broker group of a
    position; ``''`` where the broker has no groups, or for rows written before 0006."""
    return mapped_column(String(C.BROKER_NAME_MAX), primary_key=primary_key, default="", server_default="")


def _enum(cls: type[StubStatus] | type[LogOutcome], name: str) -> Enum:
    return Enum(
        cls,
        name=name,
        native_enum=False,
        length=16,
        create_constraint=True,
        validate_strings=True,
        values_callable=lambda e: [m.value for m in e],
    )


#: PostgreSQL: the status indexes of the inbox and the stubs hold open rows only (migration 0007); the
#: sweeper's walks read nothing else through them, and a confirmed row then writes no entry there.
OPEN_ROWS = text("status IN ('PENDING', 'DEAD')")


def status_literal(status: StubStatus) -> ColumnElement[Any]:
    """``status`` written into the SQL text, not bound: a query that walks a status index must say its
    status this way, so that a prepared statement's generic plan on PostgreSQL can still prove
    ``OPEN_ROWS`` and use the partial index (with ``status = $1`` it cannot)."""
    return literal_column(f"'{status.value}'")


class Base(DeclarativeBase):
    metadata = metadata


class MessageStub(Base):
    """One row per message a producer intends to deliver (written before the send): the outbox.

    ``status`` is derived from the message's inbox rows: ``CONFIRMED`` once every expected group confirmed,
    ``DEAD`` once some group's resends are exhausted, else ``PENDING`` (``VOIDED``: cancelled). The send
    columns are the topic-wide history (where the last send *to the topic* landed); a group's targeted
    resends are recorded on its inbox row.
    """

    __tablename__ = "message_stub"

    message_id: Mapped[str] = mapped_column(String(C.MESSAGE_ID_MAX), primary_key=True)
    topic: Mapped[str] = mapped_column(String(C.TOPIC_MAX))
    tags: Mapped[str | None] = mapped_column(String(C.TAGS_MAX))
    content: Mapped[bytes] = mapped_column(Body)
    #: SHA-256 hex of ``content``; lets the consumer refuse a different body under the same id.
    payload_hash: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[StubStatus] = mapped_column(_enum(StubStatus, "stub_status"), default=StubStatus.PENDING)
    send_count: Mapped[int] = mapped_column(Integer, default=0)
    queue_id: Mapped[int | None] = mapped_column(Integer)
    queue_offset: Mapped[int | None] = mapped_column(BigInteger)
    resend_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    last_sent_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    confirmed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)
    #: the message's trace context (propagation carrier as JSON) so resends carry it; see reliable.otel.
    trace_context: Mapped[str | None] = mapped_column(Text)
    #: the broker group of ``queue_id`` (RocketMQ clusters; migration 0006)
    broker_name: Mapped[str] = _broker_name()
    #: the producer's message properties (JSON text), so resends carry them (migration 0009)
    properties: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        # the sweeper's settle walk: PENDING rows in resend_at order (open rows only on PostgreSQL)
        Index(None, "status", "resend_at", postgresql_where=OPEN_ROWS),
        # the reconciliation's time window and per-queue grouping
        Index(None, "created_at"),
        Index(None, "topic", "queue_id", "queue_offset"),
    )


class MessageInbox(Base):
    """One row per ``(consumer_group, message_id)``: that group's processing state (added by migration 0003).

    Created ``PENDING`` by the producer for every group it expects, or ``CONFIRMED`` by the guard on first
    processing when no row exists (the inbox pattern: the primary key admits one writer per group). The
    guard locks and confirms this row in the transaction of the handler's writes.
    """

    __tablename__ = "message_inbox"

    consumer_group: Mapped[str] = mapped_column(String(C.GROUP_MAX), primary_key=True)
    message_id: Mapped[str] = mapped_column(String(C.MESSAGE_ID_MAX), primary_key=True)
    status: Mapped[StubStatus] = mapped_column(_enum(StubStatus, "inbox_status"), default=StubStatus.PENDING)
    #: handler failures of this group only (not lease conflicts, not database outages); reset by revive and
    #: by a targeted resend.
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    #: SHA-256 hex of the body this group expects (producer) or first processed (inbox pattern).
    payload_hash: Mapped[str | None] = mapped_column(String(64))
    first_received_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    confirmed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    #: the group's own targeted-resend history: how many, when the next is due, where the last one landed
    #: (the ``%RETRY%{group}`` queue on RocketMQ/broker_sim).
    resend_count: Mapped[int] = mapped_column(Integer, default=0)
    resend_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    queue_id: Mapped[int | None] = mapped_column(Integer)
    queue_offset: Mapped[int | None] = mapped_column(BigInteger)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    #: the broker group of the last targeted resend's queue (migration 0006)
    broker_name: Mapped[str] = _broker_name()
    #: the topic the last targeted resend landed on: ``%RETRY%{group}`` (RocketMQ 4.x, broker_sim) or the
    #: message's own (RabbitMQ, Kafka, RocketMQ 5.x); ``NULL``: no resend landed, or it was recorded before
    #: migration 0011 (readers then assume what they assumed before)
    resend_topic: Mapped[str | None] = mapped_column(String(C.TOPIC_MAX))

    __table_args__ = (
        # the sweeper's selection: PENDING rows of any group that are due (open rows only on PostgreSQL)
        Index(None, "status", "resend_at", postgresql_where=OPEN_ROWS),
        # every group of one message: deriving the stub's status, reconciliation joins
        Index(None, "message_id", "status"),
    )


class MessageLog(Base):
    """One row per delivery received (append-only journal: duplicates stay visible)."""

    __tablename__ = "message_log"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    message_id: Mapped[str] = mapped_column(String(C.MESSAGE_ID_MAX))
    consumer_group: Mapped[str] = mapped_column(String(C.GROUP_MAX))
    #: the *delivered* position: a retry delivery keeps its ``%RETRY%{group}`` topic, queue and offset.
    topic: Mapped[str] = mapped_column(String(C.TOPIC_MAX))
    queue_id: Mapped[int] = mapped_column(Integer)
    queue_offset: Mapped[int] = mapped_column(BigInteger)
    reconsume_times: Mapped[int] = mapped_column(Integer, default=0)
    received_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    outcome: Mapped[LogOutcome | None] = mapped_column(_enum(LogOutcome, "log_outcome"))
    #: which worker received it (process/thread id); lets a report attribute duplicates to a killed worker.
    worker: Mapped[str | None] = mapped_column(String(128))
    #: why the outcome is what it is (e.g. the dead-letter reason).
    reason: Mapped[str | None] = mapped_column(Text)
    #: the message's business topic (``RETRY_TOPIC`` of a retry delivery); migration 0003 back-filled it from
    #: ``topic`` (older adapters journaled the original topic there).
    original_topic: Mapped[str | None] = mapped_column(String(C.TOPIC_MAX))
    #: the broker group of the delivered queue (``Envelope.broker_name``; migration 0006)
    broker_name: Mapped[str] = _broker_name()

    __table_args__ = (
        # "was it ever logged?" (sweeper anti-join) and "newest delivery" (stuck detection)
        Index(None, "message_id", "consumer_group", "received_at"),
        # retention purge
        Index(None, "received_at"),
    )


class ConsumeProgress(Base):
    """Highest offset each (group, topic, broker group, queue) has received: the consumer's position survives
    log purges.

    ``topic`` is the delivered topic: a retry delivery raises the watermark of its ``%RETRY%`` queue only.
    ``broker_name`` is part of the key (migration 0006): on a RocketMQ cluster queue 0 of ``broker-a`` and
    queue 0 of ``broker-b`` have independent offsets. ``''``: no broker groups, or a row from before 0006.
    """

    __tablename__ = "consume_progress"

    consumer_group: Mapped[str] = mapped_column(String(C.GROUP_MAX), primary_key=True)
    topic: Mapped[str] = mapped_column(String(C.TOPIC_MAX), primary_key=True)
    queue_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    max_offset: Mapped[int] = mapped_column(BigInteger)
    #: first offset seen and when: with ``max_offset``/``updated_at`` they give the observed consumption rate
    #: that the sweeper turns into a backlog estimate.
    min_offset: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    received_count: Mapped[int] = mapped_column(BigInteger, default=0)
    broker_name: Mapped[str] = _broker_name(primary_key=True)

    # added last by migration 0006, but second-to-last in the key
    __table_args__ = (PrimaryKeyConstraint("consumer_group", "topic", "broker_name", "queue_id"),)


class StubNotification(Base):
    """Give-up notices owed to people: one row per (message, consumer group, channel).

    Added by migration 0002 per (message, channel); 0003 added the group, 0010 the claim. The ``log``
    channel's row, written delivered when the sweeper gives up or raises an alarm, is the notice; each
    sweeper owes it on its own channels (reliable/sweeper/owed.py). ``notified_at`` stays NULL until the
    channel accepted the notice, so a channel that fails (SMTP down, webhook 500) is retried on the next
    sweep round and a notice is delivered once rather than once per round. Owned by :mod:`reliable.sweeper`.
    """

    __tablename__ = "stub_notification"

    message_id: Mapped[str] = mapped_column(String(C.MESSAGE_ID_MAX), primary_key=True)
    consumer_group: Mapped[str] = mapped_column(String(C.GROUP_MAX), primary_key=True)
    channel: Mapped[str] = mapped_column(String(32), primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    notified_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    #: a sweeper is delivering the row until then (migration 0010): others skip it; a sweeper killed while
    #: delivering leaves it owed, delivered again once this has passed
    claimed_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        # "what is still owed?": the sweeper's notify step
        Index(None, "notified_at"),
    )


class KafkaOffset(Base):
    """Kafka consumer positions kept in the application database (migration 0004, optional feature).

    ``next_offset`` is the offset of the next record to process in ``(consumer_group, topic, partition)``,
    written in the guard's own transaction, so a processed record and its position commit together; on
    partition assignment the Kafka consumer seeks here. Owned by :mod:`reliable.adapters.kafka_offsets`.
    """

    __tablename__ = "kafka_offset"

    consumer_group: Mapped[str] = mapped_column(String(C.GROUP_MAX), primary_key=True)
    topic: Mapped[str] = mapped_column(String(C.TOPIC_MAX), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    next_offset: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


# --- a stub's str → str mapping columns (trace_context, properties): compact JSON text ---------------------
def mapping_json(mapping: Mapping[str, str]) -> str | None:
    """What a mapping column stores: compact JSON with sorted keys (``None`` for an empty mapping)."""
    return json.dumps(dict(mapping), sort_keys=True, separators=(",", ":")) if mapping else None


def mapping_from_json(text: str | None, column: str, log: logging.Logger, without: str) -> dict[str, str]:
    """A mapping column read back for a resend. Text that is not a JSON object (written by hand?) is logged
    on ``log`` with what the resend does ``without`` it, and read as empty: the message still goes out."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        log.warning("message_stub.%s is not JSON (%r); %s", column, exc, without)
        return {}
    if not isinstance(value, dict):
        log.warning("message_stub.%s is not a JSON object (%.80r); %s", column, text, without)
        return {}
    return {str(k): str(v) for k, v in value.items()}
