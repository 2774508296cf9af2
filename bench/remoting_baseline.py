"""The r1 baseline: the least a server can do to answer a RocketMQ send over TCP, and the client both servers
are measured with.

* :func:`serve` — a minimal asyncio server (plain ``asyncio``, one event loop, no threads). For every complete
  frame it parses the JSON header (to learn the ``opaque``: any real server must) and writes a canned
  SEND_MESSAGE_V2 success reply (``msgId``, ``queueId``, ``queueOffset``, ``MSG_REGION``) echoing that opaque.
  It stores nothing. Run as ``python -m bench.remoting_baseline`` it prints ``ready port=N`` and serves until
  stdin closes or SIGTERM.
* :class:`FrameClient` — a lean synchronous client that sends SEND_MESSAGE_V2 frames as the Java client does
  (JSON header, the one-letter V2 field names, a UNIQ_KEY per message, 1 KiB body), one at a time, and reads
  each reply before the next send. Its per-message cost is the same whichever server answers, so the ratio
  ``broker-sim serve ÷ baseline`` is what the server costs on top of the socket round trip.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import uuid
from pathlib import Path
from types import TracebackType

_LEN = struct.Struct(">i")
_LEN2 = struct.Struct(">ii")
SEND_MESSAGE_V2 = 310
RESPONSE_FLAG = 1
ROOT = Path(__file__).resolve().parents[1]


def _frame(header: dict[str, object], body: bytes) -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return _LEN2.pack(4 + len(head) + len(body), len(head)) + head + body


# ------------------------------------------------------------------------------------------------ server


class _SendResponder(asyncio.Protocol):
    def __init__(self) -> None:
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._offset = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        out = []
        while len(buf) >= 8:
            total, word = _LEN2.unpack_from(buf, 0)
            if len(buf) < 4 + total:
                break
            header = json.loads(bytes(buf[8 : 8 + (word & 0xFFFFFF)]))
            del buf[: 4 + total]
            self._offset += 1
            out.append(
                _frame(
                    {
                        "code": 0,
                        "language": "JAVA",
                        "version": 433,
                        "opaque": header["opaque"],
                        "flag": RESPONSE_FLAG,
                        "serializeTypeCurrentRPC": "JSON",
                        "extFields": {
                            "msgId": "7F00000100002A9F0000000000000000",
                            "queueId": "0",
                            "queueOffset": str(self._offset),
                            "MSG_REGION": "DefaultRegion",
                        },
                    },
                    b"",
                )
            )
        if out and self._transport is not None:
            self._transport.write(b"".join(out))


async def serve(port: int = 0) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_SendResponder, "127.0.0.1", port)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), stop.set)  # the parent closed our stdin: it is gone
    print(f"ready port={server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await stop.wait()


class BaselineProcess:
    """The baseline server in a child process (as ``broker-sim serve`` is), on a free port."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""

    def __enter__(self) -> BaselineProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.remoting_baseline"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("ready port="):
            self.proc.kill()
            raise RuntimeError(f"baseline server did not start: {line!r}")
        self.address = f"127.0.0.1:{line.split('=', 1)[1].strip()}"
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


# ------------------------------------------------------------------------------------------------ client


class FrameClient:
    """Synchronous SEND_MESSAGE_V2 sends over one socket: send a frame, read its reply, repeat."""

    def __init__(self, address: str, topic: str, body: bytes, group: str = "FrameClientP") -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.topic, self.body, self.group = topic, body, group
        self._opaque = 0
        self._queue = 0

    def close(self) -> None:
        self.sock.close()

    def frame(self) -> bytes:
        self._opaque += 1
        self._queue = (self._queue + 1) % 4
        props = f"UNIQ_KEY\x01{uuid.uuid4().hex.upper()}\x02WAIT\x01true\x02"
        fields = {
            "a": self.group, "b": self.topic, "c": "TBW102", "d": "4", "e": str(self._queue), "f": "0",
            "g": "1700000000000", "h": "0", "i": props, "j": "0", "k": "false", "m": "false",
        }  # fmt: skip
        header = {
            "code": SEND_MESSAGE_V2, "language": "JAVA", "version": 433, "opaque": self._opaque, "flag": 0,
            "serializeTypeCurrentRPC": "JSON", "extFields": fields,
        }  # fmt: skip
        return _frame(header, self.body)

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk
        return bytes(buf)

    def send(self) -> None:
        frame = self.frame()
        self.sock.sendall(frame)
        (total,) = _LEN.unpack(self._read_exact(4))
        payload = self._read_exact(total)
        header = json.loads(payload[4 : 4 + (_LEN.unpack_from(payload, 0)[0] & 0xFFFFFF)])
        if header.get("code") != 0 or header.get("opaque") != self._opaque:
            raise RuntimeError(f"unexpected reply to opaque {self._opaque}: {header}")


if __name__ == "__main__":
    asyncio.run(serve())
