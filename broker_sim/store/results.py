"""Outcomes of store operations: status enums (expected outcomes are values, not exceptions) and the result
records the messaging layer turns into RocketMQ reply codes."""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Union

from broker_sim.store.message_record import MessageExt, decode_record, offset_msg_id


class PutMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"  # written, but the sync flush did not finish in time
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"  # SYNC_MASTER: written, no slave acknowledged in time
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"  # SYNC_MASTER: written, no slave (or one far behind)
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"  # not running, or disk above the warning ratio
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"  # bad topic, body too large, field out of range
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"  # the append lock was held too long
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


_STORED = frozenset(
    {
        PutMessageStatus.PUT_OK,
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
        PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
        PutMessageStatus.SLAVE_NOT_AVAILABLE,
    }
)


class AppendMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    END_OF_FILE = "END_OF_FILE"
    MESSAGE_SIZE_EXCEEDED = "MESSAGE_SIZE_EXCEEDED"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"  # every scanned unit was filtered out by tag
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"  # the unit points below the commit log's min offset
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"  # the queue file for the offset is gone
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # offset > max
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"  # offset == max (caught up)
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"  # offset < min
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"  # queue empty


@dataclass(slots=True)
class AppendMessageResult:
    """Where a put landed. ``msg_id`` (offsetMsgId, 32 hex chars) is computed on demand."""

    status: AppendMessageStatus
    wrote_offset: int = 0  # physical (commit-log) offset of the first record
    wrote_bytes: int = 0
    queue_offset: int = 0  # of the first record
    store_timestamp: int = 0
    msg_num: int = 1
    store_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x2a\x9f"
    offsets: tuple[int, ...] = ()  # physical offset of each record of a batch (empty for one message)

    @property
    def msg_id(self) -> str:
        """offsetMsgId of the (first) record; a batch's ids are in :attr:`msg_ids`."""
        return offset_msg_id(self.store_host, self.wrote_offset)

    @property
    def msg_ids(self) -> list[str]:
        return [offset_msg_id(self.store_host, o) for o in (self.offsets or (self.wrote_offset,))]


@dataclass(slots=True)
class PutMessageResult:
    status: PutMessageStatus
    append_result: AppendMessageResult | None = None
    remark: str = ""

    @property
    def ok(self) -> bool:
        """True when the message is in the commit log (PUT_OK, or written but its flush or replication is
        late or impossible: FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE)."""
        return self.status in _STORED


class SelectedMessage:
    """One message of a get: the exact on-disk record bytes (servable as a PULL body) plus its position;
    ``ext`` decodes lazily because a pull that only forwards bytes never needs it."""

    __slots__ = ("_ext", "phys_offset", "queue_offset", "raw", "tags_code")

    _ext: MessageExt

    def __init__(self, raw: bytes, phys_offset: int, queue_offset: int, tags_code: int) -> None:
        # get_message builds one per record: four stores and nothing else (``_ext`` is set on first use)
        self.raw = raw
        self.phys_offset = phys_offset
        self.queue_offset = queue_offset
        self.tags_code = tags_code

    @property
    def ext(self) -> MessageExt:
        try:
            return self._ext
        except AttributeError:
            self._ext = decode_record(self.raw)
            return self._ext

    def __repr__(self) -> str:
        return (
            f"SelectedMessage(phys={self.phys_offset}, queue_offset={self.queue_offset}, {len(self.raw)} B)"
        )


@dataclass(slots=True)
class GetMessageResult:
    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[SelectedMessage] = field(default_factory=list)
    #: the last scanned message lies further behind the commit log's end than the share of memory RocketMQ
    #: keeps hot (``GetMessageResult.suggestPullingFromSlave``): the reader is slow, a slave may serve it
    suggest_pulling_from_slave: bool = False

    @property
    def message_count(self) -> int:
        return len(self.messages)

    @property
    def buffer_total_size(self) -> int:
        return sum(len(m.raw) for m in self.messages)

    def body(self) -> bytes:
        """The records concatenated: exactly a RocketMQ PULL reply body."""
        return b"".join(m.raw for m in self.messages)


@dataclass(slots=True)
class QueryMessageResult:
    """Messages found by key, newest first, plus the index's freshness (for the QUERY_MESSAGE reply)."""

    messages: list[SelectedMessage] = field(default_factory=list)
    index_last_update_timestamp: int = 0
    index_last_update_phy_offset: int = 0


@dataclass(slots=True)
class DispatchRequest:
    """One record as the dispatcher saw it in the commit log; handed to dispatch listeners after the
    consume queue (if any) and index are written, so a listener may read the message right away."""

    topic: str
    queue_id: int
    commit_log_offset: int
    msg_size: int
    tags_code: int
    store_timestamp: int
    consume_queue_offset: int
    sys_flag: int
    prepared_transaction_offset: int
    properties: dict[str, str]

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get("KEYS", "").split(" ") if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get("UNIQ_KEY")

    @property
    def in_consume_queue(self) -> bool:
        """False for half (prepared) and rollback transaction records, which get no queue unit."""
        return self.sys_flag & 0xC not in (0x4, 0xC)


@dataclass(slots=True)
class RecoveryReport:
    """What ``start()`` found: clean or not, where the valid commit log ends, what was cut."""

    abnormal: bool = False
    scanned_from: int = 0
    max_phy_offset: int = 0
    truncated_bytes: int = 0  # bytes of torn/corrupt tail discarded (0 on a clean start)
    problems: list[str] = field(default_factory=list)
    redispatched: int = 0


@dataclass(slots=True)
class ExpiryReport:
    disk_ratio: float = 0.0
    disk_full: bool = False  # above the warning ratio: writes are rejected until it drops
    clean_immediately: bool = False  # above the forcible ratio: oldest segments go regardless of age
    deleted_commit_log_files: list[str] = field(default_factory=list)
    deleted_consume_queue_files: int = 0
    deleted_index_files: int = 0
    min_phy_offset: int = 0


#: A tag filter: None (all), a set of tag codes (``"*"`` ⇒ pass None), or a predicate on the tag code.
MessageFilter = Union[Collection[int], Callable[[int], bool], None]  # noqa: UP007
DispatchListener = Callable[[DispatchRequest], None]
