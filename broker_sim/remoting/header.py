"""Header helpers: RocketMQ's binary ("ROCKETMQ") header type and typed access to ``extFields``.

Binary header layout (serialize type 1; Java clients may use it, the C++ client never does)::

    0      2      3        5        9        13          17           17+R     21+R
    +------+------+--------+--------+--------+-----------+------------+--------+-----------------------+
    | code | lang | version| opaque | flag   | remarkLen | remark     | extLen | ext entries           |
    | i16  | u8   | i16    | i32    | i32    | i32       | R bytes    | i32    | E bytes               |
    +------+------+--------+--------+--------+-----------+------------+--------+-----------------------+

    ext entry: i16 keyLen, key (UTF-8), i32 valueLen, value (UTF-8)

Field access follows the client-compatibility rules: numbers may arrive as JSON numbers or strings (G4),
booleans as "0"/"1"/"true"/"false" (G5); a missing or malformed required field is a
:class:`~broker_sim.remoting.errors.HeaderFieldError`, which the server answers with SYSTEM_ERROR.
"""

from __future__ import annotations

import struct

from broker_sim.remoting.codes import LanguageCode
from broker_sim.remoting.command import RemotingCommand, SerializeType
from broker_sim.remoting.errors import FrameError, HeaderFieldError

_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")


def encode_binary_header(cmd: RemotingCommand) -> bytes:
    try:
        lang = LanguageCode[cmd.language].value
    except KeyError:
        lang = LanguageCode.OTHER.value
    try:
        parts = [_FIXED.pack(cmd.code, lang, cmd.version & 0x7FFF, cmd.opaque, cmd.flag)]
    except struct.error as exc:
        raise FrameError(f"binary header cannot hold these values: {exc}") from None
    remark = (cmd.remark or "").encode("utf-8")
    parts += [_I32.pack(len(remark)), remark]
    ext = bytearray()
    for key, value in cmd.ext_fields.items():
        k, v = key.encode("utf-8"), value.encode("utf-8")
        ext += _I16.pack(len(k)) + k + _I32.pack(len(v)) + v
    parts += [_I32.pack(len(ext)), bytes(ext)]
    return b"".join(parts)


class _Reader:
    """Bounds-checked cursor: every read past the end is a FrameError, never an IndexError."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise FrameError(f"binary header: {what} length {n} runs past the header end")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, st: struct.Struct, what: str) -> tuple[int, ...]:
        return st.unpack(self.take(st.size, what))

    def text(self, n: int, what: str) -> str:
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError(f"binary header: {what} is not UTF-8") from None


def decode_binary_header(header: bytes) -> RemotingCommand:
    r = _Reader(header)
    code, lang, version, opaque, flag = r.unpack(_FIXED, "fixed part")
    (remark_len,) = r.unpack(_I32, "remark length")
    remark = r.text(remark_len, "remark") if remark_len > 0 else None
    (ext_len,) = r.unpack(_I32, "extFields length")
    ext_r = _Reader(r.take(ext_len, "extFields"))
    ext: dict[str, str] = {}
    while ext_r.pos < len(ext_r.data):
        (klen,) = ext_r.unpack(_I16, "key length")
        key = ext_r.text(klen, "key")
        (vlen,) = ext_r.unpack(_I32, "value length")
        ext[key] = ext_r.text(vlen, "value")
    try:
        language = LanguageCode(lang).name
    except ValueError:
        language = LanguageCode.OTHER.name
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=ext,
        language=language,
        version=version,
        serialize_type=SerializeType.ROCKETMQ,
    )


# ------------------------------------------------------------------------------------- typed field access

_TRUE = {"1", "true", "TRUE", "True"}
_FALSE = {"0", "false", "FALSE", "False", ""}


class Fields:
    """Typed read access to a request's ``extFields``; the 2.0 client's one-letter V2 names are mapped by
    the caller (see :data:`SEND_V2_NAMES`)."""

    def __init__(self, ext: dict[str, str]) -> None:
        self.ext = ext

    def text(self, name: str, default: str | None = None) -> str:
        value = self.ext.get(name, default)
        if value is None:
            raise HeaderFieldError(f"the request lacks the field {name!r}")
        return value

    def opt(self, name: str) -> str | None:
        return self.ext.get(name)

    def num(self, name: str, default: int | None = None) -> int:
        raw = self.ext.get(name)
        if raw is None or raw == "":
            if default is None:
                raise HeaderFieldError(f"the request lacks the field {name!r}")
            return default
        try:
            return int(raw)
        except ValueError:
            try:
                as_float = float(raw)
            except ValueError:
                raise HeaderFieldError(f"field {name!r} is not a number: {raw!r}") from None
            if not as_float.is_integer():
                raise HeaderFieldError(f"field {name!r} is not an integer: {raw!r}") from None
            return int(as_float)

    def flag(self, name: str, default: bool = False) -> bool:
        raw = self.ext.get(name)
        if raw is None:
            return default
        if raw in _TRUE:
            return True
        if raw in _FALSE:
            return False
        raise HeaderFieldError(f"field {name!r} is not a boolean: {raw!r}")


# SEND_MESSAGE_V2 (310) abbreviates SendMessageRequestHeader's fields to single letters.
SEND_V2_NAMES = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
}


def expand_send_v2(ext: dict[str, str]) -> dict[str, str]:
    """SEND_MESSAGE_V2 / batch headers in their long names, so one handler serves 10, 310 and 320."""
    return {SEND_V2_NAMES.get(k, k): v for k, v in ext.items()}
