"""A loopback TCP relay in front of a Redis the demo does not own, so that "Redis down" can be injected
without stopping a server other people may be using.

The consumers connect to the relay instead of the server. :meth:`TcpRelay.outage` closes every relayed
connection and refuses new ones for a while (the listening socket is closed, so a connect gets
ECONNREFUSED, exactly what clients see when the server is down), then listens again on the same port. The
server itself never notices.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger("reliable.demo.netproxy")


@dataclass
class TcpRelay:
    """Relays ``127.0.0.1:port`` to ``upstream`` (host, port) with one thread per direction per connection."""

    upstream: tuple[str, int]
    port: int = 0
    _listener: socket.socket | None = None
    _conns: set[socket.socket] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: threading.Event = field(default_factory=threading.Event)
    _resume: threading.Event = field(default_factory=threading.Event)
    #: set while an outage refuses connections (from the cut until the relay listens again)
    refusing: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self._listen()

    def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), name="relay-accept", daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # listener closed: outage or stop
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError as exc:
                log.warning("relay: upstream %s unreachable: %s", self.upstream, exc)
                client.close()
                continue
            with self._lock:
                self._conns.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), name="relay-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        # an OSError here means the other direction or an outage closed the pair: closing is all that is left
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            self._drop(s)

    def _drop(self, s: socket.socket) -> None:
        with self._lock:
            self._conns.discard(s)
        with contextlib.suppress(OSError):  # already closed by the peer
            s.shutdown(socket.SHUT_RDWR)
        s.close()

    def _cut(self) -> int:
        if self._listener is not None:
            # shutdown() wakes the thread blocked in accept() (close() alone leaves the kernel socket
            # listening until that call returns)
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns = list(self._conns)
        for s in conns:
            self._drop(s)
        return len(conns) // 2

    def outage(self, seconds: float) -> int:
        """Refuse and cut every connection for ``seconds`` (or until :meth:`resume`); returns how many
        connections were cut. :attr:`refusing` is set for as long as connections are refused."""
        self._resume.clear()
        cut = self._cut()
        self.refusing.set()
        self._resume.wait(seconds)
        if not self._closed.is_set():
            self._listen()
        self.refusing.clear()
        return cut

    def resume(self) -> None:
        """End a running outage now: the relay listens again."""
        self._resume.set()

    def stop(self) -> None:
        self._closed.set()
        self._resume.set()
        self._cut()

    @property
    def url_netloc(self) -> str:
        return f"127.0.0.1:{self.port}"


def relayed(url: str) -> tuple[TcpRelay | None, str]:
    """Put a :class:`TcpRelay` in front of a ``redis://`` server the demo does not own (for the Redis outage
    fault): the started relay and the URL through it; other schemes are used as they are (no relay)."""
    parsed = urlsplit(url)
    if parsed.scheme != "redis" or not parsed.hostname:
        return None, url
    relay = TcpRelay((parsed.hostname, parsed.port or 6379))
    relay.start()
    netloc = parsed.netloc.rsplit("@", 1)
    auth = netloc[0] + "@" if len(netloc) == 2 else ""
    return relay, urlunsplit(parsed._replace(netloc=auth + relay.url_netloc))
