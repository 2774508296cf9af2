"""Reading frames off a blocking socket, as many per ``recv`` as the kernel has ready.

Why not "read 4 bytes, then read the frame": that is two system calls per frame, and a peer with many
requests in flight (64 async sends, a pull and a heartbeat) has several frames waiting at once. One
``recv_into`` of up to :data:`RECV_CHUNK` bytes takes them all, and the caller can then answer the whole
batch with one write. Both ends use this: the server's reader thread per connection and the client's reader.

The hardening of the old reader is kept: each length word is checked (:func:`check_total_length`) as soon as
its 4 bytes are buffered, before any more of that frame is read, so a peer can make us hold at most one
maximal frame plus one chunk. A frame that does not decode ends the stream; the frames before it in the
same chunk are still returned first (their requests were well-formed and get answered), and the error is
raised by the next call.
"""

from __future__ import annotations

import struct
from typing import Protocol

from broker_sim.remoting.command import RemotingCommand
from broker_sim.remoting.errors import FrameError
from broker_sim.remoting.frame import MAX_FRAME_BYTES, check_total_length, decode_from

#: bytes asked of one ``recv_into``: 64 frames of a 1 KiB message fit, and it stays below the allocator's
#: mmap threshold
RECV_CHUNK = 96 * 1024

_LEN = struct.Struct(">i")


class Readable(Protocol):
    """What the stream reads from: a blocking socket (or anything with its ``recv_into``)."""

    def recv_into(self, buffer: memoryview, /) -> int: ...


class FrameStream:
    """``read_batch()`` → the next complete frames (at least one), or None on a clean end of stream."""

    def __init__(self, sock: Readable, max_frame: int = MAX_FRAME_BYTES) -> None:
        self.sock = sock
        self.max_frame = max_frame
        self._buf = bytearray()
        self._chunk = bytearray(RECV_CHUNK)
        self._chunk_view = memoryview(self._chunk)
        self._error: FrameError | None = None

    def read_batch(self) -> list[RemotingCommand] | None:
        """Block until at least one frame is complete. Raises :class:`FrameError` for a malformed frame
        or a stream that ends inside a frame, and ``OSError`` for a socket error."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        while True:
            k = self.sock.recv_into(self._chunk_view)
            if k == 0:
                if buf:
                    raise FrameError(f"truncated frame: connection closed with {len(buf)} bytes of a frame")
                return None
            buf += self._chunk_view[:k]
            out = self._split()
            if out:
                return out
            if self._error is not None:
                raise self._error

    def _split(self) -> list[RemotingCommand]:
        buf = self._buf
        out: list[RemotingCommand] = []
        pos, have = 0, len(buf)
        try:
            while have - pos >= 4:
                (total,) = _LEN.unpack_from(buf, pos)
                check_total_length(total, self.max_frame)
                end = pos + 4 + total
                if end > have:
                    break
                out.append(decode_from(buf, pos + 4, end))
                pos = end
        except FrameError as exc:
            self._error = exc
            buf.clear()
            return out
        if pos:
            del buf[:pos]
        return out
