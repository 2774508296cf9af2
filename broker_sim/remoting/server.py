"""A threaded TCP server for the remoting protocol: one reader thread per connection, a bounded worker pool
for requests.

Why threads and not asyncio: broker operations block (a SYNC_FLUSH send waits for fsync, a suspended pull
waits up to 15 s for a message), and the broker is written as plain blocking Python. Each request therefore
runs on a worker thread; the connection's reader keeps reading, so one client can have a held pull and a
heartbeat in flight on the same socket, as the C++ client does. Replies are written under a per-connection
lock and matched by ``opaque``. The reader takes every frame one ``recv`` brought
(:mod:`broker_sim.remoting.stream`), and the replies of the requests it answers itself (the non-blocking
``inline_codes``) leave together in one write: a client with 64 sends in flight costs two system calls per
batch, not two per request.

Hardening: the reader validates the length word before reading a frame (16 MiB cap), a frame that cannot be
decoded closes the connection (the stream is out of sync), a decodable request with bad fields or an unknown
code gets an error reply, and every handler exception is logged and answered with SYSTEM_ERROR. In-flight
requests per connection are capped, so a client flooding requests is slowed by TCP back-pressure instead of
growing a queue.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from broker_sim.common.errors import BrokerResponseError
from broker_sim.remoting.codes import ResponseCode, code_name
from broker_sim.remoting.errors import AclError, FrameError, HeaderFieldError
from broker_sim.remoting.frame import MAX_FRAME_BYTES, RemotingCommand, encode
from broker_sim.remoting.stream import FrameStream

log = logging.getLogger("broker_sim.remoting.server")


class Deferred:
    """Returned by a handler whose reply comes later from another thread (a held long-poll pull)."""


DEFERRED = Deferred()

Handler = Callable[[RemotingCommand, "Connection"], "RemotingCommand | Deferred | None"]


class RequestGuard(Protocol):
    """Checked before every request (the ACL hook); raises :class:`AclError` to refuse it."""

    def check(self, cmd: RemotingCommand) -> None: ...


class Connection:
    """One accepted socket. ``client_id`` is learnt from HEART_BEAT so the broker can call the client back
    (NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE)."""

    def __init__(self, sock: socket.socket, peer: str, max_inflight: int) -> None:
        self.sock = sock
        self.peer = peer
        self.client_id: str | None = None
        self._write_lock = threading.Lock()
        self.inflight = threading.BoundedSemaphore(max_inflight)
        self.closed = threading.Event()
        self.requests = 0
        self._replies: dict[int, tuple[threading.Event, list[RemotingCommand]]] = {}
        self._replies_lock = threading.Lock()

    def invoke(self, cmd: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """A broker → client request that expects a reply (GET_CONSUMER_RUNNING_INFO,
        CONSUME_MESSAGE_DIRECTLY): TimeoutError if the client does not answer in time."""
        done: tuple[threading.Event, list[RemotingCommand]] = (threading.Event(), [])
        with self._replies_lock:
            self._replies[cmd.opaque] = done
        try:
            if not self.send(cmd):
                raise ConnectionError(f"client {self.peer} is gone")
            if not done[0].wait(timeout_s):
                raise TimeoutError(f"client {self.peer} did not answer request {cmd.code} in {timeout_s} s")
            return done[1][0]
        finally:
            with self._replies_lock:
                self._replies.pop(cmd.opaque, None)

    def complete(self, reply: RemotingCommand) -> bool:
        """Hand a client's response frame to the :meth:`invoke` waiting for it; False if none waits."""
        with self._replies_lock:
            waiting = self._replies.get(reply.opaque)
        if waiting is None:
            return False
        waiting[1].append(reply)
        waiting[0].set()
        return True

    def send(self, cmd: RemotingCommand) -> bool:
        """Write one frame; False (and the connection closed) if the peer is gone."""
        return self._write(encode(cmd))

    def send_all(self, cmds: list[RemotingCommand]) -> bool:
        """Write several frames with one system call; False (and the connection closed) if the peer is
        gone."""
        return self._write(b"".join([encode(c) for c in cmds]))

    def _write(self, data: bytes) -> bool:
        with self._write_lock:
            if self.closed.is_set():
                return False
            try:
                self.sock.sendall(data)
                return True
            except OSError as exc:
                log.info("connection %s: write failed (%s); closing", self.peer, exc)
                self.close()
                return False

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        with contextlib.suppress(OSError):  # already disconnected by the peer: nothing left to shut down
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


@dataclass
class ServerStats:
    connections: int = 0
    requests: int = 0
    frame_errors: int = 0
    handler_errors: int = 0
    unsupported: int = 0
    acl_denied: int = 0
    by_code: dict[int, int] = field(default_factory=dict)


class RemotingServer:
    """Listen on ``host:port`` and answer requests with ``handlers[code]``.

    ``inline_codes``: requests handled on the connection's reader thread instead of the pool — only for
    handlers that cannot block (they would stall the connection); everything else goes to the pool.

    ``port=0`` picks a free port (read :attr:`port` after :meth:`start`). ``name`` prefixes log lines, so the
    name server and the broker in one ``broker-sim serve`` process can be told apart.
    """

    def __init__(
        self,
        handlers: dict[int, Handler],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        name: str = "remoting",
        workers: int = 64,
        max_inflight_per_connection: int = 256,
        max_frame: int = MAX_FRAME_BYTES,
        guard: RequestGuard | None = None,
        on_disconnect: Callable[[Connection], None] | None = None,
        inline_codes: Iterable[int] = (),
    ) -> None:
        self.handlers = handlers
        self.host = host
        self._port = port
        self.name = name
        self.max_frame = max_frame
        self.guard = guard
        self.on_disconnect = on_disconnect
        # Requests that never block (or reply later by themselves) run on the connection's reader thread:
        # two thread hand-offs less per request, which is most of a small request's cost in CPython.
        self.inline_codes = frozenset(inline_codes)
        self._max_inflight = max_inflight_per_connection
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{name}-worker")
        self._sock: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._conns: set[Connection] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.stats = ServerStats()

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"{self.host}:{self._port}"

    def connections(self) -> list[Connection]:
        with self._lock:
            return list(self._conns)

    def bind(self) -> None:
        """Bind and listen (idempotent). Separate from :meth:`start` so ``port=0`` can be resolved before the
        broker is built: the broker needs its own address for STOREHOST and message ids."""
        if self._sock is not None:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self._port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        self._port = sock.getsockname()[1]
        self._sock = sock

    def start(self) -> None:
        self.bind()
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"{self.name}-accept", daemon=True
        )
        self._accept_thread.start()
        log.info("%s listening on %s", self.name, self.address)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every connection, wait for running handlers (up to ``timeout``)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):  # a listening socket reports ENOTCONN on some systems
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout)
        for conn in self.connections():
            conn.close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        log.info("%s stopped", self.name)

    # -- accept / read --

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stopping.is_set():
            try:
                sock, addr = self._sock.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                log.exception("%s: accept failed", self.name)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Connection(sock, f"{addr[0]}:{addr[1]}", self._max_inflight)
            with self._lock:
                self._conns.add(conn)
                self.stats.connections += 1
            log.info("%s: connection from %s", self.name, conn.peer)
            threading.Thread(
                target=self._read_loop, args=(conn,), name=f"{self.name}-conn", daemon=True
            ).start()

    def _read_loop(self, conn: Connection) -> None:
        reason = "closed by peer"
        stream = FrameStream(conn.sock, self.max_frame)
        try:
            while not conn.closed.is_set():
                batch = stream.read_batch()
                if batch is None:
                    break
                if not self._handle_batch(conn, batch):
                    break
        except FrameError as exc:
            with self._lock:
                self.stats.frame_errors += 1
            reason = f"bad frame: {exc}"
            log.warning("%s: %s sent a bad frame (%s); closing", self.name, conn.peer, exc)
        except OSError as exc:
            reason = f"socket error: {exc}"
        finally:
            conn.close()
            with self._lock:
                self._conns.discard(conn)
            log.info(
                "%s: connection %s closed (%s, %d requests)", self.name, conn.peer, reason, conn.requests
            )
            if self.on_disconnect is not None:
                try:
                    self.on_disconnect(conn)
                except Exception:
                    log.exception("%s: disconnect hook failed for %s", self.name, conn.peer)

    def _handle_batch(self, conn: Connection, batch: list[RemotingCommand]) -> bool:
        """Answer the frames of one read; False when the server is stopping. The replies of requests run
        here (inline codes) are written together once the batch is done — one write for 64 pipelined sends
        instead of 64 — and before any error ends the connection, so every request read gets its answer."""
        replies: list[RemotingCommand] = []
        try:
            for cmd in batch:
                conn.requests += 1
                if cmd.is_response:
                    if not conn.complete(cmd):
                        log.debug("%s: stray response from %s: %d", self.name, conn.peer, cmd.opaque)
                    continue
                if cmd.code in self.inline_codes:
                    reply = self.dispatch(cmd, conn)
                    if isinstance(reply, RemotingCommand) and not cmd.is_oneway:
                        replies.append(reply)
                    continue
                conn.inflight.acquire()
                try:
                    self._pool.submit(self._run, conn, cmd)
                except RuntimeError:  # pool shut down: the server is stopping
                    conn.inflight.release()
                    return False
        finally:
            if replies:
                conn.send_all(replies)
        return True

    # -- dispatch --

    def _reply(self, conn: Connection, cmd: RemotingCommand) -> None:
        reply = self.dispatch(cmd, conn)
        if isinstance(reply, RemotingCommand) and not cmd.is_oneway:
            conn.send(reply)

    def _run(self, conn: Connection, cmd: RemotingCommand) -> None:
        try:
            self._reply(conn, cmd)
        finally:
            conn.inflight.release()

    def dispatch(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | Deferred | None:
        """Run the handler for ``cmd`` and return its reply (errors become error replies, never raise)."""
        with self._lock:
            self.stats.requests += 1
            self.stats.by_code[cmd.code] = self.stats.by_code.get(cmd.code, 0) + 1
        if log.isEnabledFor(logging.DEBUG):  # `serve --log-level DEBUG`: what a client actually sends
            log.debug(
                "%s: %s request %s opaque=%d flag=%d lang=%s v%d ext=%s body=%d B",
                self.name,
                conn.peer,
                code_name(cmd.code),
                cmd.opaque,
                cmd.flag,
                cmd.language,
                cmd.version,
                cmd.ext_fields,
                len(cmd.body),
            )
        handler = self.handlers.get(cmd.code)
        if handler is None:
            with self._lock:
                self.stats.unsupported += 1
            log.info("%s: %s sent unsupported request code %d", self.name, conn.peer, cmd.code)
            return cmd.reply(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request type {cmd.code} not supported"
            )
        try:
            if self.guard is not None:
                self.guard.check(cmd)
            return handler(cmd, conn)
        except AclError as exc:
            with self._lock:
                self.stats.acl_denied += 1
            log.warning("%s: %s denied %s: %s", self.name, conn.peer, code_name(cmd.code), exc)
            return cmd.reply(ResponseCode.NO_PERMISSION, str(exc))
        except HeaderFieldError as exc:
            log.warning("%s: %s bad %s request: %s", self.name, conn.peer, code_name(cmd.code), exc)
            return cmd.reply(ResponseCode.SYSTEM_ERROR, str(exc))
        except BrokerResponseError as exc:
            return cmd.reply(exc.code, exc.remark)
        except Exception as exc:
            with self._lock:
                self.stats.handler_errors += 1
            log.exception("%s: %s request %s failed", self.name, conn.peer, code_name(cmd.code))
            return cmd.reply(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
