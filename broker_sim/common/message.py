"""Message value types shared by producers, consumers, the broker and the transports.

A :class:`Message` is what a producer sends; a :class:`MessageExt` is what the broker stored and a consumer
receives (the message plus where and when it was stored). Routing data that RocketMQ keeps in the message's
string properties (keys, tags, delay level, retry bookkeeping) stays in ``properties`` under RocketMQ's own
property names, because the wire format and the real C++ client read those names.
"""

from __future__ import annotations

import enum
import itertools
import os
import random
import socket
import struct
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


class Prop:
    """RocketMQ message property names (``MessageConst``)."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT = "WAIT"
    DELAY = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    TRAN_MSG = "TRAN_MSG"
    PRODUCER_GROUP = "PGROUP"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    UNIQ_KEY = "UNIQ_KEY"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    RECONSUME_TIME = "RECONSUME_TIME"
    CONSUME_START_TIME = "CONSUME_START_TIME"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    SHARDING_KEY = "SHARDING_KEY"
    CLUSTER = "CLUSTER"


class SysFlag:
    """Bits of a stored message's ``sysFlag`` (and of a pull request's ``sysFlag``, prefixed PULL_)."""

    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_NOT_TYPE = 0x0
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    TRANSACTION_ROLLBACK = 0xC
    TRANSACTION_MASK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20
    PULL_COMMIT_OFFSET = 0x1
    PULL_SUSPEND = 0x2
    PULL_SUBSCRIPTION = 0x4
    PULL_CLASS_FILTER = 0x8


class ConsumeStatus(enum.Enum):
    """What a concurrent listener returns for a batch."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(enum.Enum):
    """What an orderly listener returns; SUSPEND retries the same batch locally after a pause."""

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


class LocalTransactionState(enum.Enum):
    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"  # RocketMQ's spelling, kept so logs read the same as Java's


@dataclass(frozen=True, order=True, slots=True)
class MessageQueue:
    """One queue of a topic on one broker; ordering (topic, broker, id) is what allocators sort by."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}"


@dataclass
class Message:
    """A message to send. ``keys`` (str or several) and ``tags`` become the KEYS/TAGS properties."""

    topic: str
    body: bytes
    keys: str | Iterable[str] | None = None
    tags: str | None = None
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    delay_time_level: int = 0
    wait_store_msg_ok: bool = True

    def __post_init__(self) -> None:
        if self.keys is not None and not isinstance(self.keys, str):
            self.keys = " ".join(self.keys)
        if self.keys:
            self.properties[Prop.KEYS] = str(self.keys)
        elif Prop.KEYS in self.properties:
            self.keys = self.properties[Prop.KEYS]
        if self.tags:
            self.properties[Prop.TAGS] = self.tags
        elif Prop.TAGS in self.properties:
            self.tags = self.properties[Prop.TAGS]
        if self.delay_time_level > 0:
            self.properties[Prop.DELAY] = str(self.delay_time_level)
        elif Prop.DELAY in self.properties:
            self.delay_time_level = int(self.properties[Prop.DELAY])
        if not self.wait_store_msg_ok:
            self.properties[Prop.WAIT] = "false"

    @property
    def key_list(self) -> list[str]:
        return self.properties.get(Prop.KEYS, "").split()

    def set_delay_time_level(self, level: int) -> None:
        self.delay_time_level = level
        if level > 0:
            self.properties[Prop.DELAY] = str(level)
        else:
            self.properties.pop(Prop.DELAY, None)


@dataclass
class MessageExt(Message):
    """A stored message as a consumer (or an admin query) sees it.

    ``msg_id`` is the client's UNIQ_KEY when the producer set one (RocketMQ's ``MessageClientExt.getMsgId``),
    else the broker's ``offset_msg_id`` (store host + commit-log offset, 32 hex chars).
    """

    queue_id: int = 0
    queue_offset: int = 0
    commit_log_offset: int = 0
    store_size: int = 0
    sys_flag: int = 0
    body_crc: int = 0
    born_timestamp: int = 0
    born_host: str = "127.0.0.1:0"
    store_timestamp: int = 0
    store_host: str = "127.0.0.1:10911"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    offset_msg_id: str = ""
    broker_name: str = ""

    @property
    def msg_id(self) -> str:
        return self.properties.get(Prop.UNIQ_KEY) or self.offset_msg_id

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(Prop.UNIQ_KEY)

    @property
    def message_queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)


@dataclass(frozen=True)
class SendResult:
    """Outcome of a successful send (failures raise). ``msg_id`` is the client UNIQ_KEY."""

    status: SendStatus
    msg_id: str
    queue_id: int
    queue_offset: int
    offset_msg_id: str = ""
    topic: str = ""
    broker_name: str = ""
    transaction_id: str | None = None

    @property
    def message_queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)


@dataclass(frozen=True)
class TransactionSendResult(SendResult):
    local_transaction_state: LocalTransactionState = LocalTransactionState.UNKNOW


# -- ids -----------------------------------------------------------------------------------------------------

_counter = itertools.count(1)
_counter_lock = threading.Lock()


def _local_ipv4() -> bytes:
    try:
        return socket.inet_aton(socket.gethostbyname(socket.gethostname()))
    except OSError:
        return socket.inet_aton("127.0.0.1")


_ID_PREFIX = _local_ipv4() + struct.pack(">HH", os.getpid() & 0xFFFF, random.getrandbits(16))


def new_uniq_key() -> str:
    """A client message id like RocketMQ's (32 uppercase hex chars, unique per process and call).

    Layout (16 bytes): ``ip(4) | pid(2) | random(2) | counter(8)``. Java mixes a timestamp into the last
    bytes; a 64-bit per-process counter is simpler and never wraps, and the random block separates processes
    that reuse a pid.
    """
    with _counter_lock:
        n = next(_counter)
    return (_ID_PREFIX + struct.pack(">Q", n)).hex().upper()


def encode_offset_msg_id(store_host: str, commit_log_offset: int) -> str:
    """Broker message id: ``IPv4(4) | port(int32) | commitLogOffset(int64)`` as 32 uppercase hex chars."""
    host, _, port = store_host.rpartition(":")
    try:
        ip = socket.inet_aton(host or "127.0.0.1")
    except OSError:
        ip = socket.inet_aton("127.0.0.1")
    return (ip + struct.pack(">iq", int(port or 0), commit_log_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """``(store_host "ip:port", commit_log_offset)`` of an offset message id; ValueError if malformed."""
    raw = bytes.fromhex(msg_id)
    if len(raw) != 16:
        raise ValueError(f"offset message id must be 32 hex chars, got {msg_id!r}")
    port, offset = struct.unpack(">iq", raw[4:])
    return f"{socket.inet_ntoa(raw[:4])}:{port}", offset


def properties_to_string(props: Mapping[str, str]) -> str:
    """RocketMQ property encoding: ``name\\x01value`` pairs joined by ``\\x02``, no trailing separator (Java's
    ``MessageDecoder.messageProperties2String``; decoders accept the C++ client's trailing one too)."""
    return "\x02".join(f"{k}\x01{v}" for k, v in props.items())


def string_to_properties(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split("\x02"):
        if item:
            k, _, v = item.partition("\x01")
            out[k] = v
    return out
