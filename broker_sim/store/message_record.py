"""The commit-log record (= a message in a PULL body), its properties string, the broker message id
(offsetMsgId) and Java's ``String.hashCode`` (tag codes, index keys).

Record layout, IPv4 hosts, all integers big-endian (``HEADER`` covers bytes 0..87)::

    0  TOTALSIZE i32 | 4  MAGICCODE i32 0xDAA320A7 | 8  BODYCRC i32 (crc32 & 0x7FFFFFFF)
    12 QUEUEID i32   | 16 FLAG i32   | 20 QUEUEOFFSET i64 | 28 PHYSICALOFFSET i64 | 36 SYSFLAG i32
    40 BORNTIMESTAMP i64 | 48 BORNHOST 4B ip + i32 port | 56 STORETIMESTAMP i64 | 64 STOREHOST ip+port
    72 RECONSUMETIMES i32 | 76 PREPAREDTRANSACTIONOFFSET i64 | 84 BODYLEN i32
    88 BODY | TOPICLEN i8 | TOPIC | PROPERTIESLEN i16 | PROPERTIES

so a record is ``91 + len(body) + len(topic) + len(properties)`` bytes. The end of a segment is marked by
``int32 remaining, int32 BLANK_MAGIC`` when the next record does not fit.
"""

from __future__ import annotations

import dataclasses
import mmap
import re
import socket
import struct
import sys
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from operator import mul
from typing import Union

from broker_sim.store.config import SCHEDULE_TOPIC
from broker_sim.store.errors import MessageIllegalError, PropertiesSizeExceededError

Buffer = Union[bytes, bytearray, memoryview, mmap.mmap]  # noqa: UP007

MESSAGE_MAGIC = 0xDAA320A7 - 2**32  # as a signed int32 (-626843481)
BLANK_MAGIC = 0xCBD43194 - 2**32  # signed int32 (-875286124)
MAGIC_BYTES = struct.pack(">I", 0xDAA320A7)
END_FILE_MIN_BLANK = 8
FIXED_SIZE = 91

# TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSOFFSET SYSFLAG BORNTS BORNHOST STORETS STOREHOST
# RECONSUME PREPARED BODYLEN
HEADER = struct.Struct(">iiiiiqqiq8sq8siqi")
assert HEADER.size == 88
BLANK = struct.Struct(">ii")
I8 = struct.Struct(">b")
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
HOST = struct.Struct(">4si")
MSG_ID = struct.Struct(">4siq")

# sysFlag bits
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOST_V6_FLAG = 0x20

NAME_VALUE_SEP = "\x01"
PROPERTY_SEP = "\x02"
# property names (MessageConst)
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_DELAY = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
KEY_SEPARATOR = " "

TOPIC_MAX_LEN = 127
PROPERTIES_MAX_LEN = 32767
_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")


def check_topic(topic: str) -> bytes:
    """Validate a topic the way the broker does (``TopicValidator``) and return its UTF-8 bytes."""
    if not topic or not topic.strip():
        raise MessageIllegalError("topic is blank")
    if not _TOPIC_RE.match(topic):
        raise MessageIllegalError(f"topic {topic!r} contains characters outside [%|a-zA-Z0-9_-]")
    raw = topic.encode("utf-8")
    if len(raw) > TOPIC_MAX_LEN:
        raise MessageIllegalError(f"topic is {len(raw)} bytes, more than {TOPIC_MAX_LEN}")
    return raw


# ---------------------------------------------------------------------------------------------- hashing
_POW31 = [pow(31, k, 2**32) for k in range(4096)]
_UTF16 = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode()`` (signed int32 over UTF-16 code units): ``Σ c[i]·31^(n-1-i)``.

    Evaluated as a dot product with precomputed powers (C-level ``map``/``sum``) because the obvious
    per-character loop costs microseconds per key on the dispatch hot path.
    """
    if s.isascii():
        units: bytes | memoryview = s.encode("ascii")
    else:
        units = memoryview(s.encode(_UTF16)).cast("H")
    n = len(units)
    if n > len(_POW31):
        h = 0
        for c in units:
            h = (31 * h + c) & 0xFFFFFFFF
    else:
        h = sum(map(mul, reversed(units), _POW31)) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def java_hash_concat(prefix_hash: int, suffix: str) -> int:
    """``String.hashCode(prefix + suffix)`` from the prefix's hash: ``h(p)·31^len(s) + h(s)`` (mod 2³²),
    so index keys ``topic#key`` only hash the key part per message."""
    n = len(suffix) if suffix.isascii() else len(suffix.encode(_UTF16)) // 2
    mult = _POW31[n] if n < len(_POW31) else pow(31, n, 2**32)
    h = (prefix_hash * mult + java_string_hash(suffix)) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


@lru_cache(maxsize=4096)
def tags_hash(tags: str) -> int:
    """Consume-queue tag code of a TAGS property (cached: tag sets are small)."""
    return java_string_hash(tags)


# ------------------------------------------------------------------------------------------- properties
def encode_properties(props: dict[str, str]) -> bytes:
    """``name\\x01value`` pairs joined by ``\\x02`` with no trailing separator, byte for byte what RocketMQ
    4.9.8 stores (``MessageDecoder.messageProperties2String``); the C++ client's trailing ``\\x02`` on the
    wire is not kept, because the broker re-encodes the parsed properties as Java's broker does."""
    if not props:
        return b""
    return "\x02".join([f"{k}\x01{v}" for k, v in props.items()]).encode("utf-8")


def decode_properties(raw: bytes | str) -> dict[str, str]:
    """Inverse of :func:`encode_properties`; tolerates a missing trailing separator (Java writes none)."""
    text = raw.decode("utf-8") if isinstance(raw, bytes | bytearray | memoryview) else raw
    out: dict[str, str] = {}
    for item in text.split(PROPERTY_SEP):
        if item:
            name, sep, value = item.partition(NAME_VALUE_SEP)
            if sep:
                out[name] = value
    return out


# -------------------------------------------------------------------------------------------- hosts, ids
@lru_cache(maxsize=1024)
def host_bytes(host: tuple[str, int]) -> bytes:
    """``("10.0.0.1", 10911)`` → 8 bytes (IPv4 + int32 port), as in BORNHOST/STOREHOST."""
    ip, port = host
    try:
        packed = socket.inet_aton(ip)
    except OSError as exc:
        raise MessageIllegalError(f"host {ip!r} is not an IPv4 address") from exc
    if not 0 <= port <= 0x7FFFFFFF:
        raise MessageIllegalError(f"port {port} out of range")
    return HOST.pack(packed, port)


def host_from_bytes(raw: bytes) -> tuple[str, int]:
    ip, port = HOST.unpack(raw)
    return socket.inet_ntoa(ip), port


def offset_msg_id(store_host: bytes, phys_offset: int) -> str:
    """offsetMsgId: uppercase hex of store IPv4 + port + commit-log offset (32 chars)."""
    return (store_host + I64.pack(phys_offset)).hex().upper()


def decode_msg_id(msg_id: str) -> tuple[tuple[str, int], int]:
    """offsetMsgId → ((ip, port), commit-log offset). Raises MessageIllegalError for a malformed id."""
    if len(msg_id) != 32:
        raise MessageIllegalError(f"msgId {msg_id!r} is not 32 hex characters")
    try:
        ip, port, offset = MSG_ID.unpack(bytes.fromhex(msg_id))
    except ValueError as exc:
        raise MessageIllegalError(f"msgId {msg_id!r} is not hex") from exc
    return (socket.inet_ntoa(ip), port), offset


# -------------------------------------------------------------------------------------------- messages
@dataclass(slots=True)
class MessageInner:
    """A message as handed to the store: everything the record holds except what the store assigns
    (queue offset, physical offset, store timestamp, CRC). ``store_host`` None = the store's own."""

    topic: str
    body: bytes
    queue_id: int = 0
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    store_host: tuple[str, int] | None = None
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]


@dataclass(slots=True)
class MessageExt:
    """A record decoded from disk (every field of the layout)."""

    store_size: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    commit_log_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]

    @property
    def msg_id(self) -> str:
        """offsetMsgId (what a send reply calls ``msgId``)."""
        return offset_msg_id(host_bytes(self.store_host), self.commit_log_offset)

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)


def encode_record(
    msg: MessageInner,
    queue_offset: int,
    phys_offset: int,
    store_timestamp: int,
    store_host: bytes,
) -> bytes:
    """One whole record as bytes (used by tests, batch bodies and tools; the commit log writes the same
    layout straight into its mapped file instead of building this intermediate)."""
    topic_b = check_topic(msg.topic)
    props_b = encode_properties(msg.properties)
    if len(props_b) > PROPERTIES_MAX_LEN:
        raise PropertiesSizeExceededError(f"properties are {len(props_b)} bytes, more than 32767")
    body = bytes(msg.body)
    size = FIXED_SIZE + len(body) + len(topic_b) + len(props_b)
    born = host_bytes(msg.born_host)
    shost = store_host if msg.store_host is None else host_bytes(msg.store_host)
    buf = bytearray(size)
    HEADER.pack_into(
        buf, 0, size, MESSAGE_MAGIC, zlib.crc32(body) & 0x7FFFFFFF, msg.queue_id, msg.flag, queue_offset,
        phys_offset, msg.sys_flag, msg.born_timestamp, born, store_timestamp, shost, msg.reconsume_times,
        msg.prepared_transaction_offset, len(body),
    )  # fmt: skip
    p = 88 + len(body)
    buf[88:p] = body
    buf[p] = len(topic_b)
    buf[p + 1 : p + 1 + len(topic_b)] = topic_b
    p += 1 + len(topic_b)
    I16.pack_into(buf, p, len(props_b))
    buf[p + 2 :] = props_b
    return bytes(buf)


def schedule_rewrite(msg: MessageInner, levels: int) -> MessageInner:
    """RocketMQ's delay rewrite (``CommitLog.putMessage``): DELAY level > 0 on a message that is not a half or
    rollback record nor already on the schedule topic → ``SCHEDULE_TOPIC_XXXX`` queue level−1, with
    ``REAL_TOPIC``/``REAL_QID`` set and the level clamped to the ``levels`` configured."""
    delay = msg.properties.get(PROPERTY_DELAY)
    if delay is None or msg.topic == SCHEDULE_TOPIC or msg.sys_flag & 0xC in (0x4, 0xC):
        return msg
    try:
        level = int(delay)
    except ValueError as exc:
        raise MessageIllegalError(f"DELAY property {delay!r} is not an integer level") from exc
    if level <= 0:
        return msg
    level = min(level, levels)
    props = dict(msg.properties)
    props[PROPERTY_REAL_TOPIC] = msg.topic
    props[PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
    props[PROPERTY_DELAY] = str(level)
    return dataclasses.replace(msg, topic=SCHEDULE_TOPIC, queue_id=level - 1, properties=props)


class RecordCheck:
    """Why a record failed verification (the strings end up in recovery reports)."""

    BAD_MAGIC = "bad magic"
    BAD_SIZE = "size out of range"
    BAD_CRC = "body CRC mismatch"
    BAD_LAYOUT = "field lengths disagree with TOTALSIZE"
    BAD_OFFSET = "PHYSICALOFFSET disagrees with position"


def verify_record(buf: Buffer, pos: int, limit: int, phys_offset: int) -> str | None:
    """None if the record at ``buf[pos:]`` is whole and sound (magic, size, layout, CRC, offset), else
    the reason. ``limit`` is the end of readable data; ``phys_offset`` the offset the record claims."""
    if pos + 91 > limit:
        return RecordCheck.BAD_SIZE
    size, magic, crc = struct.unpack_from(">iii", buf, pos)
    if magic != MESSAGE_MAGIC:
        return RecordCheck.BAD_MAGIC
    if size < FIXED_SIZE or pos + size > limit:
        return RecordCheck.BAD_SIZE
    (body_len,) = I32.unpack_from(buf, pos + 84)
    if body_len < 0 or 88 + body_len + 1 > size:
        return RecordCheck.BAD_LAYOUT
    (tlen,) = I8.unpack_from(buf, pos + 88 + body_len)
    p = pos + 89 + body_len + max(tlen, 0)
    if tlen <= 0 or p + 2 > pos + size:
        return RecordCheck.BAD_LAYOUT
    (plen,) = I16.unpack_from(buf, p)
    if plen < 0 or p + 2 + plen != pos + size:
        return RecordCheck.BAD_LAYOUT
    if I64.unpack_from(buf, pos + 28)[0] != phys_offset:
        return RecordCheck.BAD_OFFSET
    if zlib.crc32(buf[pos + 88 : pos + 88 + body_len]) & 0x7FFFFFFF != crc:
        return RecordCheck.BAD_CRC
    return None


def decode_record(buf: Buffer, pos: int = 0) -> MessageExt:
    """Decode one record starting at ``buf[pos]`` (no CRC check: see :func:`verify_record`)."""
    (size, magic, crc, qid, flag, qoff, phys, sysflag, born_ts, born, store_ts, shost, reconsume, prepared,
     body_len) = HEADER.unpack_from(buf, pos)  # fmt: skip
    if magic != MESSAGE_MAGIC:
        raise MessageIllegalError(f"no message record at {pos} (magic {magic & 0xFFFFFFFF:#x})")
    p = pos + 88
    body = bytes(buf[p : p + body_len])
    p += body_len
    (tlen,) = I8.unpack_from(buf, p)
    topic = bytes(buf[p + 1 : p + 1 + tlen]).decode("utf-8")
    p += 1 + tlen
    (plen,) = I16.unpack_from(buf, p)
    props = decode_properties(bytes(buf[p + 2 : p + 2 + plen])) if plen > 0 else {}
    return MessageExt(
        size, crc, qid, flag, qoff, phys, sysflag, born_ts, host_from_bytes(born), store_ts,
        host_from_bytes(shost), reconsume, prepared, body, topic, props,
    )  # fmt: skip
