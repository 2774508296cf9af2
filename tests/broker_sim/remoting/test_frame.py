"""Frame codec: round-trips (hypothesis), the client-compatibility rules and hostile input."""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_sim.remoting.errors import FrameError, FrameTooLargeError, HeaderFieldError
from broker_sim.remoting.frame import (
    MAX_FRAME_BYTES,
    FrameDecoder,
    RemotingCommand,
    SerializeType,
    decode_frame,
    encode,
)
from broker_sim.remoting.header import Fields, expand_send_v2

text = st.text(max_size=40)
ext_fields = st.dictionaries(st.text(min_size=1, max_size=20), text, max_size=8)
commands = st.builds(
    RemotingCommand,
    code=st.integers(-(2**15), 2**15 - 1),
    opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.integers(0, 3),
    remark=st.none() | st.text(min_size=1, max_size=60),
    ext_fields=ext_fields,
    body=st.binary(max_size=300),
    language=st.sampled_from(["JAVA", "CPP", "PYTHON", "GO"]),
    version=st.integers(0, 2**15 - 1),
    serialize_type=st.sampled_from(list(SerializeType)),
)


@given(commands)
def test_round_trip(cmd: RemotingCommand) -> None:
    assert decode_frame(encode(cmd)) == cmd


@given(st.lists(commands, min_size=1, max_size=5), st.integers(1, 64))
def test_stream_decoder_reassembles_any_chunking(cmds: list[RemotingCommand], chunk: int) -> None:
    stream = b"".join(encode(c) for c in cmds)
    dec = FrameDecoder()
    out: list[RemotingCommand] = []
    for i in range(0, len(stream), chunk):
        out += dec.feed(stream[i : i + chunk])
    assert out == cmds
    assert dec.buffered == 0


def test_json_reply_keeps_top_byte_zero_and_string_fields() -> None:
    """G1 and G2: the C++ client reads the whole word as the header length and ignores non-strings."""
    req = RemotingCommand(code=10, opaque=7)
    rep = req.reply(0, ext_fields={"queueId": 3, "queueOffset": 12, "ok": True, "none": None})
    frame = encode(rep)
    total, word = struct.unpack_from(">ii", frame)
    assert word >> 24 == 0 and total == len(frame) - 4
    header = json.loads(frame[8 : 8 + word])
    assert header["opaque"] == 7 and header["flag"] == 1
    assert header["extFields"] == {"queueId": "3", "queueOffset": "12", "ok": "true"}


def test_requests_with_numbers_and_booleans_are_accepted() -> None:
    """G4/G5: a C++ request mixes JSON numbers and strings; booleans arrive as 0/1 or true/false."""
    header = {
        "code": 11,
        "language": "CPP",
        "version": 63,
        "opaque": 5,
        "flag": 0,
        "extFields": {"queueId": 2, "maxMsgNums": 32.0, "topic": "T", "unitMode": False, "batch": "0"},
    }
    raw = (json.dumps(header) + "\n").encode()
    frame = struct.pack(">ii", 4 + len(raw), len(raw)) + raw
    cmd = decode_frame(frame)
    f = Fields(cmd.ext_fields)
    assert (f.num("queueId"), f.num("maxMsgNums"), f.text("topic")) == (2, 32, "T")
    assert f.flag("unitMode") is False and f.flag("batch") is False
    for raw_bool, expected in (("1", True), ("true", True), ("0", False), ("false", False)):
        assert Fields({"b": raw_bool}).flag("b") is expected
    with pytest.raises(HeaderFieldError):
        Fields({"b": "maybe"}).flag("b")
    with pytest.raises(HeaderFieldError):
        Fields({}).num("queueId")
    with pytest.raises(HeaderFieldError):
        Fields({"q": "x1"}).num("q")


def test_send_v2_names_expand() -> None:
    assert expand_send_v2({"a": "G", "b": "T", "e": "1", "zz": "k"}) == {
        "producerGroup": "G",
        "topic": "T",
        "queueId": "1",
        "zz": "k",
    }


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (b"\x00\x00", "truncated"),
        (struct.pack(">i", 2) + b"\x00\x00", "below the minimum"),
        (struct.pack(">i", -5), "below the minimum"),
        (struct.pack(">ii", 8, 100) + b"abcd", "header length"),
        (struct.pack(">ii", 7, 3) + b"{x}", "not valid JSON"),
        (struct.pack(">ii", 6, 2) + b"[]", "not an object"),
        (struct.pack(">ii", 15, 11) + b'{"code":"x"}'[:11], "not valid JSON"),
        (struct.pack(">ii", 16, 12) + b'{"code":"x"}', "must be an integer"),
        (struct.pack(">ii", 8, (7 << 24) | 4) + b"abcd", "serialize type"),
        (struct.pack(">ii", 12, 4) + b"{}", "declares"),
        (struct.pack(">ii", 4 + 9, 9) + b'{"cod":1}', "must be an integer"),
        (struct.pack(">ii", 4 + 2, 2) + b"\xff\xfe", "not valid JSON"),
        (struct.pack(">ii", 4 + 5, (1 << 24) | 5) + b"\x00\x0a\x00\x00\x01", "binary header"),
    ],
)
def test_malformed_frames_raise_frame_error(frame: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        decode_frame(frame)


def test_oversized_frame_is_refused_before_buffering() -> None:
    dec = FrameDecoder()
    with pytest.raises(FrameTooLargeError):
        dec.feed(struct.pack(">i", MAX_FRAME_BYTES + 1))
    assert dec.buffered == 0
    with pytest.raises(FrameError):
        dec.feed(b"more")  # the stream is out of sync: nothing further is accepted


def test_binary_header_with_lying_lengths() -> None:
    cmd = RemotingCommand(code=34, remark="r", ext_fields={"k": "v"}, serialize_type=SerializeType.ROCKETMQ)
    frame = bytearray(encode(cmd))
    # remark length (after total, word and the 13 fixed bytes) claims far more than the header holds
    struct.pack_into(">i", frame, 8 + 13, 10_000)
    with pytest.raises(FrameError, match="runs past"):
        decode_frame(bytes(frame))


@settings(max_examples=300)
@given(st.sampled_from([c for c in range(3)]), st.binary(max_size=200), st.data())
def test_byte_mutations_never_escape_as_other_exceptions(kind: int, junk: bytes, data: st.DataObject) -> None:
    """Any mutation of a valid frame decodes or raises FrameError; nothing else escapes."""
    base = encode(
        RemotingCommand(
            code=11,
            opaque=3,
            ext_fields={"topic": "T", "queueId": "1"},
            body=b"payload",
            serialize_type=data.draw(st.sampled_from(list(SerializeType))),
        )
    )
    frame = bytearray(base)
    if kind == 0:  # flip bytes
        for _ in range(data.draw(st.integers(1, 6))):
            i = data.draw(st.integers(0, len(frame) - 1))
            frame[i] = data.draw(st.integers(0, 255))
    elif kind == 1:  # truncate / extend
        frame = frame[: data.draw(st.integers(0, len(frame)))] + junk
    else:  # splice junk into the header
        i = data.draw(st.integers(0, len(frame)))
        frame[i:i] = junk
    dec = FrameDecoder()
    with contextlib.suppress(FrameError):
        dec.feed(bytes(frame))
    assert dec.buffered <= len(frame)
