"""Message records as they travel in PULL and VIEW_MESSAGE_BY_ID bodies (the commit-log layout, IPv4).

Layout (reference §E; all big-endian)::

    0  TOTALSIZE i32        4  MAGICCODE i32        8  BODYCRC i32        12 QUEUEID i32
    16 FLAG i32             20 QUEUEOFFSET i64      28 PHYSICALOFFSET i64 36 SYSFLAG i32
    40 BORNTIMESTAMP i64    48 BORNHOST ip4+i32     56 STORETIMESTAMP i64 64 STOREHOST ip4+i32
    72 RECONSUMETIMES i32   76 PREPARED_TX_OFFSET i64
    84 BODYLEN i32, BODY    .. TOPICLEN i8 (signed), TOPIC    .. PROPLEN i16 (signed), PROPERTIES

The store owns writing these; this module only decodes them for the TCP client and patches STOREHOST on
the way out (rule G7: a 1.x C++ client sends CONSUMER_SEND_MSG_BACK to the STOREHOST it finds in the record,
so it must be the address the broker listens on *now*, not whatever the store was configured with when the
message was written). Decoding is bounds-checked: a malformed record is a :class:`RecordError`.
"""

from __future__ import annotations

import socket
import struct
import zlib
from collections.abc import Iterator

from broker_sim.common.message import MessageExt, encode_offset_msg_id, string_to_properties
from broker_sim.remoting.errors import RemotingError

MAGIC = 0xDAA320A7
MAGIC_SIGNED = struct.unpack(">i", struct.pack(">I", MAGIC))[0]
_FIXED = struct.Struct(">iiiiiqqiq4siq4siiqi")  # up to and including BODYLEN
FIXED_SIZE = _FIXED.size  # 88
STOREHOST_AT = 64
SYSFLAG_AT = 36
_V6_BITS = 0x10 | 0x20
_COMPRESSED = 0x1


class RecordError(RemotingError):
    """A record in a PULL/VIEW body does not parse."""


def _host(raw_ip: bytes, port: int) -> str:
    return f"{socket.inet_ntoa(raw_ip)}:{port}"


def _host_bytes(addr: str) -> bytes:
    host, _, port = addr.rpartition(":")
    return socket.inet_aton(host) + struct.pack(">i", int(port))


def split_records(body: bytes) -> Iterator[tuple[int, int]]:
    """(start, size) of each record in a concatenation, checking every size against what remains."""
    pos = 0
    while pos < len(body):
        if len(body) - pos < FIXED_SIZE:
            raise RecordError(f"record at {pos}: {len(body) - pos} bytes left, need at least {FIXED_SIZE}")
        (size,) = struct.unpack_from(">i", body, pos)
        if size < FIXED_SIZE + 3 or size > len(body) - pos:
            raise RecordError(f"record at {pos}: size {size} does not fit the {len(body) - pos} bytes left")
        yield pos, size
        pos += size


def with_store_host(body: bytes, store_host: str) -> bytes:
    """``body`` (concatenated IPv4 records) with every STOREHOST replaced by ``store_host``."""
    host = _host_bytes(store_host)
    out = bytearray(body)
    for start, _size in split_records(body):
        (sys_flag,) = struct.unpack_from(">i", out, start + SYSFLAG_AT)
        if sys_flag & _V6_BITS:
            raise RecordError("IPv6 host fields are not served (G6: the C++ client reads IPv4 only)")
        out[start + STOREHOST_AT : start + STOREHOST_AT + 8] = host
    return bytes(out)


def decode_record(buf: bytes, start: int = 0, *, broker_name: str = "") -> MessageExt:
    (
        size,
        magic,
        body_crc,
        queue_id,
        flag,
        queue_offset,
        phys_offset,
        sys_flag,
        born_ts,
        born_ip,
        born_port,
        store_ts,
        store_ip,
        store_port,
        reconsume,
        prepared,
        body_len,
    ) = _FIXED.unpack_from(buf, start)
    if magic != MAGIC_SIGNED:
        raise RecordError(f"record at {start}: bad magic {magic & 0xFFFFFFFF:#x}")
    if sys_flag & _V6_BITS:
        raise RecordError(f"record at {start}: IPv6 host fields are not supported")
    end = start + size
    pos = start + FIXED_SIZE
    if body_len < 0 or pos + body_len + 1 > end:
        raise RecordError(f"record at {start}: body length {body_len} overruns the record")
    body = bytes(buf[pos : pos + body_len])
    pos += body_len
    (topic_len,) = struct.unpack_from(">b", buf, pos)
    pos += 1
    if topic_len < 0 or pos + topic_len + 2 > end:
        raise RecordError(f"record at {start}: topic length {topic_len} overruns the record")
    topic = bytes(buf[pos : pos + topic_len]).decode("utf-8", "replace")
    pos += topic_len
    (prop_len,) = struct.unpack_from(">h", buf, pos)
    pos += 2
    if prop_len < 0 or pos + prop_len > end:
        raise RecordError(f"record at {start}: properties length {prop_len} overruns the record")
    props = string_to_properties(bytes(buf[pos : pos + prop_len]).decode("utf-8", "replace"))
    if sys_flag & _COMPRESSED:
        try:
            body = zlib.decompress(body)
        except zlib.error as exc:
            raise RecordError(f"record at {start}: compressed body does not inflate: {exc}") from None
    store_host = _host(store_ip, store_port)
    msg = MessageExt(
        topic=topic,
        body=body,
        flag=flag,
        properties=props,
        queue_id=queue_id,
        queue_offset=queue_offset,
        commit_log_offset=phys_offset,
        store_size=size,
        sys_flag=sys_flag,
        body_crc=body_crc,
        born_timestamp=born_ts,
        born_host=_host(born_ip, born_port),
        store_timestamp=store_ts,
        store_host=store_host,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        offset_msg_id=encode_offset_msg_id(store_host, phys_offset),
        broker_name=broker_name,
    )
    return msg


def decode_records(body: bytes, *, broker_name: str = "") -> list[MessageExt]:
    return [decode_record(body, start, broker_name=broker_name) for start, _ in split_records(body)]
