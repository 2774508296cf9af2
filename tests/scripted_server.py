"""A TCP server in a thread that answers every connection the same way: the misbehaving peer a test needs (a
webhook that redirects or speaks no HTTP, a sentinel that accepts and closes) without a real service of
that kind."""

from __future__ import annotations

import socket
import threading


class ScriptedServer:
    """Answers every connection with ``reply`` (raw bytes, after reading the request), or closes it at once
    (``reply=None``); counts the connections and keeps what each sent."""

    def __init__(self, reply: bytes | None = None) -> None:
        self.reply = reply
        self.accepted = 0
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def url(self, scheme: str = "http", path: str = "/") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                if self.reply is not None:
                    self.requests.append(conn.recv(65536))
                    conn.sendall(self.reply)

    def close(self) -> None:
        self.sock.close()
