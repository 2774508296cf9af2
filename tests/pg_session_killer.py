"""A TCP proxy in front of PostgreSQL that ends chosen sessions the way ``pg_terminate_backend`` does.

Why a proxy: the server ends a killed session by sending a ``FATAL 57P01`` error and closing, and the backend
takes a few milliseconds to go. A pooled connection checked out in that window passes the pool's checkout
check (:mod:`reliable.pool_liveness`: nothing to read on its socket yet) and fails at its first statement —
how a burst of killed sessions (a failover, a DBA's kill) reached the guard's settle step, one run in eight.
Here the window is made exact: :meth:`SessionKiller.kill_open` marks every session open now, and each
answers its *next* request with that same ``FATAL`` error and closes; until then its socket stays silent, so
the checkout check cannot tell. Sessions opened afterwards are forwarded untouched.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field

from broker_sim.common.net import listen_port

#: PostgreSQL ErrorResponse ('E', int32 length, fields, terminator) as the server sends it for
#: pg_terminate_backend: severity FATAL, SQLSTATE 57P01 (admin_shutdown)
_FIELDS = b"SFATAL\x00VFATAL\x00C57P01\x00Mterminating connection due to administrator command\x00\x00"
ADMIN_SHUTDOWN = b"E" + struct.pack("!I", 4 + len(_FIELDS)) + _FIELDS


@dataclass
class _Session:
    client: socket.socket
    server: socket.socket
    doomed: bool = False
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        self.closed = True
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):  # already gone: closing is all that is left
                s.shutdown(socket.SHUT_RDWR)
            s.close()


class SessionKiller:
    """Listens on 127.0.0.1:``port`` and forwards to ``upstream``; :meth:`kill_open` dooms open sessions."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = listen_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._sessions: list[_Session] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="pg-killer-accept", daemon=True).start()

    def kill_open(self) -> int:
        """Doom every session open now: each answers its next request ``FATAL 57P01`` and closes."""
        with self._lock:
            self._sessions = [s for s in self._sessions if not s.closed]
            for s in self._sessions:
                s.doomed = True
            return len(self._sessions)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for s in sessions:
            s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self.upstream)
            session = _Session(client, server)
            with self._lock:
                self._sessions.append(session)
            threading.Thread(target=self._upstream, args=(session,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(session,), daemon=True).start()

    def _upstream(self, s: _Session) -> None:
        """Client → server; a doomed session's next request is answered by the proxy, then it is closed."""
        try:
            while data := s.client.recv(65536):
                if s.doomed:
                    with s.lock:
                        s.client.sendall(ADMIN_SHUTDOWN)
                    break
                s.server.sendall(data)
        except OSError:
            pass  # one side went away: the session ends below
        s.close()

    def _downstream(self, s: _Session) -> None:
        try:
            while data := s.server.recv(65536):
                with s.lock:
                    s.client.sendall(data)
        except OSError:
            pass  # one side went away: the session ends below
        s.close()
