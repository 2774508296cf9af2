"""A TCP proxy that can freeze: what a client sees of a server that hangs without closing anything.

While frozen, no byte is forwarded in either direction, and a new connection is accepted (the kernel
completes the TCP handshake, as it does for a SIGSTOPped server, a paused VM or a network partitioned after
the SYN queue) but gets nothing — not even a server greeting. :meth:`FreezingProxy.thaw` lets it all go on.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from broker_sim.common.net import listen_port


class FreezingProxy:
    """Listens on 127.0.0.1:``port`` and forwards to ``upstream`` until :meth:`freeze`."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = listen_port()
        self._running = threading.Event()  # set: forwarding; clear: frozen
        self._running.set()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="freezing-proxy-accept", daemon=True).start()

    def freeze(self) -> None:
        self._running.clear()

    def thaw(self) -> None:
        self._running.set()

    def close(self) -> None:
        self._closed = True
        self._running.set()
        self._listener.close()
        for s in list(self._sockets):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            self._sockets.append(client)
            threading.Thread(target=self._open, args=(client,), daemon=True).start()

    def _open(self, client: socket.socket) -> None:
        self._running.wait()  # a frozen server greets nobody
        if self._closed:
            return
        server = socket.create_connection(self.upstream)
        self._sockets.append(server)
        for src, dst in ((client, server), (server, client)):
            threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):  # either side closed: the session is over
            while data := src.recv(65536):
                self._running.wait()
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
