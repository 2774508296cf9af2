"""Reading frames off a socket: whatever the chunking, every frame comes out once, in order; frames that
arrived together come out together; a bad frame ends the stream only after the good ones before it."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_sim.remoting.errors import FrameError, FrameTooLargeError
from broker_sim.remoting.frame import MAX_FRAME_BYTES, RemotingCommand, encode
from broker_sim.remoting.stream import RECV_CHUNK, FrameStream


class ChunkedPeer:
    """Hands out pre-cut chunks, one per ``recv_into``; then end of stream. Counts the reads."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.reads = 0

    def recv_into(self, buffer: memoryview, /) -> int:
        self.reads += 1
        if not self.chunks:
            return 0
        chunk = self.chunks.pop(0)
        assert len(chunk) <= len(buffer), "a test chunk larger than one read"
        buffer[: len(chunk)] = chunk
        return len(chunk)


def cut(data: bytes, sizes: list[int]) -> list[bytes]:
    out, pos, i = [], 0, 0
    while pos < len(data):
        size = sizes[i % len(sizes)]
        out.append(data[pos : pos + size])
        pos, i = pos + size, i + 1
    return out


def read_all(stream: FrameStream) -> list[RemotingCommand]:
    out: list[RemotingCommand] = []
    while (batch := stream.read_batch()) is not None:
        assert batch, "a batch is never empty"
        out += batch
    return out


commands = st.builds(
    lambda code, opaque, fields, body: RemotingCommand.request(code, fields, body),
    st.integers(0, 400),
    st.integers(0, 2**31 - 1),
    st.dictionaries(st.text("abcxyz", min_size=1, max_size=4), st.text(max_size=8), max_size=4),
    st.binary(max_size=3000),
)


@given(
    st.lists(commands, min_size=1, max_size=12), st.lists(st.integers(1, RECV_CHUNK), min_size=1, max_size=5)
)
def test_any_chunking_yields_every_frame_once_in_order(cmds: list[RemotingCommand], sizes: list[int]) -> None:
    data = b"".join(encode(c) for c in cmds)
    got = read_all(FrameStream(ChunkedPeer(cut(data, sizes))))
    assert [(c.code, c.opaque, c.ext_fields, c.body) for c in got] == [
        (c.code, c.opaque, c.ext_fields, c.body) for c in cmds
    ]


def test_frames_that_arrive_together_are_read_together() -> None:
    """64 pipelined requests in one segment: one read, one batch (so the server can answer them with one
    write)."""
    frames = b"".join(encode(RemotingCommand.request(310, {"i": i}, b"x" * 1024)) for i in range(64))
    peer = ChunkedPeer([frames])
    batch = FrameStream(peer).read_batch()
    assert batch is not None and [c.ext_fields["i"] for c in batch] == [str(i) for i in range(64)]
    assert peer.reads == 1


def test_good_frames_before_a_bad_one_come_first_then_the_error() -> None:
    good = encode(RemotingCommand.request(10, {"n": 1})) + encode(RemotingCommand.request(10, {"n": 2}))
    bad = struct.pack(">ii", 10, 6) + b"{nope}"
    stream = FrameStream(ChunkedPeer([good + bad + encode(RemotingCommand.request(10))]))
    batch = stream.read_batch()
    assert batch is not None and [c.ext_fields["n"] for c in batch] == ["1", "2"]
    with pytest.raises(FrameError, match="not valid JSON"):
        stream.read_batch()
    with pytest.raises(FrameError):  # the stream is out of sync for good
        stream.read_batch()


def test_an_oversized_length_is_refused_before_its_frame_is_read() -> None:
    peer = ChunkedPeer([struct.pack(">i", MAX_FRAME_BYTES + 1), b"\x00" * 1000])
    stream = FrameStream(peer)
    with pytest.raises(FrameTooLargeError):
        stream.read_batch()
    assert peer.reads == 1  # nothing more was read once the length word was known


def test_end_of_stream_inside_a_frame_is_an_error_and_between_frames_is_not() -> None:
    frame = encode(RemotingCommand.request(10, {"k": "v"}, b"body"))
    with pytest.raises(FrameError, match="truncated"):
        read_all(FrameStream(ChunkedPeer([frame + frame[:7]])))
    assert len(read_all(FrameStream(ChunkedPeer([frame, frame])))) == 2
    assert FrameStream(ChunkedPeer([])).read_batch() is None
