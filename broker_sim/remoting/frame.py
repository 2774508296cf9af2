"""RocketMQ remoting frames: the unit of every request and reply on the wire.

Frame layout (all integers big-endian)::

    0         4                         8                8+headerLen          4+totalLen
    +---------+-------------------------+-------------------+-------------------+
    | total   | serType<<24 | headerLen | header            | body              |
    | int32   | int32                   | headerLen bytes   | total-4-headerLen |
    +---------+-------------------------+-------------------+-------------------+

``total`` counts everything after itself. ``serType`` is 0 for a JSON header and 1 for RocketMQ's binary
header (:mod:`broker_sim.remoting.header`). The C++ client reads the whole second word as the header
length, so replies to it must keep the top byte 0 (JSON) — rule G1 — which is why a reply always uses the
serialize type of its request.

Decoding is defensive because the server reads bytes from anyone on the socket: every length is checked
before memory is committed to it, so a hostile peer can make us hold at most one maximal frame
(:data:`MAX_FRAME_BYTES`, 16 MiB as in Java) per connection, and every malformed frame becomes a
:class:`~broker_sim.remoting.errors.FrameError` rather than an arbitrary exception.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from broker_sim.remoting.command import (
    LANGUAGE as LANGUAGE,
)
from broker_sim.remoting.command import (
    VERSION as VERSION,
)
from broker_sim.remoting.command import (
    RemotingCommand as RemotingCommand,
)
from broker_sim.remoting.command import (
    SerializeType as SerializeType,
)
from broker_sim.remoting.command import (
    next_opaque as next_opaque,
)
from broker_sim.remoting.command import (
    stringify_fields as stringify_fields,
)
from broker_sim.remoting.errors import FrameError, FrameTooLargeError
from broker_sim.remoting.header import decode_binary_header, encode_binary_header

MAX_FRAME_BYTES = 16 * 1024 * 1024
# Sanity bound on the header alone: no legitimate header comes near this, and refusing early keeps a
# JSON parser away from megabytes of attacker-chosen nesting.
MAX_HEADER_BYTES = 1024 * 1024

_LEN = struct.Struct(">i")  # total length
_LEN2 = struct.Struct(">ii")  # total length, serType<<24 | headerLen
# Built once: ``json.dumps`` with non-default arguments builds a new encoder on every call, and calling the
# decoder directly skips ``json.loads``' argument dispatch (every frame's header goes through these).
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_JSON_DECODER = json.JSONDecoder()


# ---------------------------------------------------------------------------------------------- encoding


def encode(cmd: RemotingCommand) -> bytes:
    """The complete frame for ``cmd``, length prefix included."""
    if cmd.serialize_type is SerializeType.ROCKETMQ:
        header = encode_binary_header(cmd)
    else:
        header = encode_json_header(cmd)
    total = 4 + len(header) + len(cmd.body)
    if total > MAX_FRAME_BYTES:
        raise FrameTooLargeError(f"frame of {total} bytes exceeds {MAX_FRAME_BYTES}")
    return b"".join((_LEN2.pack(total, (int(cmd.serialize_type) << 24) | len(header)), header, cmd.body))


def encode_json_header(cmd: RemotingCommand) -> bytes:
    obj: dict[str, Any] = {
        "code": cmd.code,
        "language": cmd.language,
        "version": cmd.version,
        "opaque": cmd.opaque,
        "flag": cmd.flag,
        "serializeTypeCurrentRPC": "JSON",
    }
    if cmd.remark is not None:
        obj["remark"] = cmd.remark
    if cmd.ext_fields:
        obj["extFields"] = cmd.ext_fields
    return _JSON_ENCODER.encode(obj).encode("utf-8")


# ---------------------------------------------------------------------------------------------- decoding


def check_total_length(total: int, max_frame: int = MAX_FRAME_BYTES) -> None:
    """Validate the first word before reading the rest: a frame holds at least the header-length word."""
    if total < 4:
        raise FrameError(f"frame length {total} is below the minimum of 4")
    if total > max_frame:
        raise FrameTooLargeError(f"frame length {total} exceeds the maximum of {max_frame}")


def decode_payload(payload: bytes) -> RemotingCommand:
    """Decode everything after the total-length word (``len(payload)`` is the declared total)."""
    return decode_from(payload, 0, len(payload))


def decode_from(buf: bytes | bytearray, start: int, end: int) -> RemotingCommand:
    """Decode the payload ``buf[start:end]`` in place (a reader's buffer holding several frames): only the
    header and the body are copied out."""
    size = end - start
    if size < 4:
        raise FrameError("frame too short for its header-length word")
    (word,) = _LEN.unpack_from(buf, start)
    ser = (word >> 24) & 0xFF
    header_len = word & 0xFFFFFF
    if header_len > size - 4:
        raise FrameError(f"header length {header_len} exceeds the frame's {size - 4} bytes")
    if header_len > MAX_HEADER_BYTES:
        raise FrameTooLargeError(f"header length {header_len} exceeds {MAX_HEADER_BYTES}")
    body_start = start + 4 + header_len
    if isinstance(buf, bytes):
        header, body = buf[start + 4 : body_start], buf[body_start:end]
    else:
        with memoryview(buf) as view:
            header, body = view[start + 4 : body_start].tobytes(), view[body_start:end].tobytes()
    if ser == SerializeType.JSON:
        cmd = decode_json_header(header)
    elif ser == SerializeType.ROCKETMQ:
        cmd = decode_binary_header(header)
    else:
        raise FrameError(f"unknown serialize type {ser}")
    cmd.body = body
    return cmd


def decode_frame(frame: bytes, max_frame: int = MAX_FRAME_BYTES) -> RemotingCommand:
    """Decode exactly one complete frame (length prefix included); trailing or missing bytes are errors."""
    if len(frame) < 4:
        raise FrameError("truncated frame: no length word")
    (total,) = _LEN.unpack_from(frame, 0)
    check_total_length(total, max_frame)
    if len(frame) - 4 != total:
        raise FrameError(f"frame declares {total} bytes but {len(frame) - 4} follow")
    return decode_payload(frame[4:])


def _as_int(obj: dict[str, Any], key: str, default: int | None) -> int:
    value = obj.get(key, default)
    if type(value) is int:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.lstrip("-").isdigit():
            return int(value)
        raise FrameError(f"header field {key!r} must be an integer, got {value!r}")
    return value


def decode_json_header(header: bytes) -> RemotingCommand:
    try:
        obj = _JSON_DECODER.decode(header.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FrameError(f"header is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError("header JSON is not an object")
    code = _as_int(obj, "code", None)
    opaque = _as_int(obj, "opaque", 0)
    flag = _as_int(obj, "flag", 0)
    version = _as_int(obj, "version", 0)
    remark = obj.get("remark")
    if remark is not None and not isinstance(remark, str):
        remark = str(remark)
    language = obj.get("language")
    ext = obj.get("extFields") or {}
    if not isinstance(ext, dict):
        raise FrameError("header field 'extFields' is not an object")
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=normalise_ext_fields(ext),
        language=language if isinstance(language, str) else "OTHER",
        version=version,
        serialize_type=SerializeType.JSON,
    )


def normalise_ext_fields(ext: dict[str, Any]) -> dict[str, str]:
    """Requests mix JSON numbers, booleans and strings (G4/G5); nested values are a client bug."""
    for value in ext.values():
        if type(value) is not str:
            break
    else:  # all strings already (the Java client's case): keys of a JSON object are strings too
        return ext
    out: dict[str, str] = {}
    for key, value in ext.items():
        if value is None:
            continue
        if isinstance(value, dict | list):
            raise FrameError(f"extFields[{key!r}] is not a scalar")
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
            out[key] = str(int(value))
        else:
            out[key] = str(value)
    return out


class FrameDecoder:
    """Incremental decoder for a byte stream: ``feed`` returns the frames completed so far.

    Memory is bounded: the length word is validated as soon as it is complete, so the buffer never grows
    beyond one maximal frame plus the last chunk fed. After a :class:`FrameError` the stream is out of sync
    and the decoder refuses further input.
    """

    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_frame
        self._broken = False

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[RemotingCommand]:
        if self._broken:
            raise FrameError("stream already failed to decode")
        self._buf += data
        out: list[RemotingCommand] = []
        try:
            while len(self._buf) >= 4:
                (total,) = _LEN.unpack_from(self._buf, 0)
                check_total_length(total, self._max)
                if len(self._buf) < 4 + total:
                    break
                payload = bytes(self._buf[4 : 4 + total])
                del self._buf[: 4 + total]
                out.append(decode_payload(payload))
        except FrameError:
            self._broken = True
            self._buf.clear()
            raise
        return out
