"""The remoting command: one request or reply as a value (code, opaque, flag, remark, header fields, body).

Both codecs build and read these — the frame codec (:mod:`broker_sim.remoting.frame`, JSON headers) and the
binary header codec (:mod:`broker_sim.remoting.header`) — so the type lives apart from either and neither
imports the other for it (RocketMQ's ``RemotingCommand``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from broker_sim.remoting.codes import CommandFlag

LANGUAGE = "PYTHON"
VERSION = 317  # a 4.x Java version number; the server never branches on the peer's version


class SerializeType(IntEnum):
    JSON = 0
    ROCKETMQ = 1


# plain ints: testing a bit against an IntFlag member runs the enum's Python-level ``__and__``
_RESPONSE = int(CommandFlag.RESPONSE)
_ONEWAY = int(CommandFlag.ONEWAY)

_opaque_counter = itertools.count(1)


def next_opaque() -> int:
    """Process-wide request id; replies echo it so a connection can multiplex requests. (``next`` on an
    ``itertools.count`` is one C call, atomic under the GIL: no lock needed.)"""
    return next(_opaque_counter) & 0x7FFFFFFF


@dataclass(slots=True)
class RemotingCommand:
    """One request or reply. ``ext_fields`` is always ``str → str`` here: requests arrive with numbers and
    booleans mixed in (G4, G5) and are normalised on decode; replies must be strings only (G2)."""

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    language: str = LANGUAGE
    version: int = VERSION
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return self.flag & _RESPONSE != 0

    @property
    def is_oneway(self) -> bool:
        return self.flag & _ONEWAY != 0

    @classmethod
    def request(
        cls,
        code: int,
        ext_fields: Mapping[str, Any] | None = None,
        body: bytes = b"",
        *,
        oneway: bool = False,
    ) -> RemotingCommand:
        return cls(
            code=int(code),
            opaque=next_opaque(),
            flag=_ONEWAY if oneway else 0,
            ext_fields=stringify_fields(ext_fields or {}),
            body=body,
        )

    def reply(
        self,
        code: int,
        remark: str | None = None,
        ext_fields: dict[str, Any] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """The response to this request: same opaque and serialize type, response bit set."""
        return RemotingCommand(
            code=int(code),
            opaque=self.opaque,
            flag=_RESPONSE,
            remark=remark,
            ext_fields=stringify_fields(ext_fields or {}),
            body=body,
            serialize_type=self.serialize_type,
        )


def stringify_fields(fields: Mapping[str, Any]) -> dict[str, str]:
    """Every header value as a string (G2); ``None`` drops the field, booleans become "true"/"false"."""
    out: dict[str, str] = {}
    for key, value in fields.items():
        if type(value) is str:  # the common case first (a send's 13 fields are mostly strings already)
            out[str(key)] = value
            continue
        if value is None:
            continue
        if isinstance(value, bool):
            out[str(key)] = "true" if value else "false"
        elif isinstance(value, float) and value.is_integer():
            out[str(key)] = str(int(value))
        else:
            out[str(key)] = str(value)
    return out
