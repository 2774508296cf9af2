"""Client side of the remoting protocol: one multiplexed TCP connection per remote address.

Requests carry a fresh ``opaque``; a reader thread matches replies to waiting callers, so many requests
(a 15 s long-poll pull, a heartbeat, a send) share one socket as they do in the Java and C++ clients.
Requests without a reply in time fail with :class:`RequestTimeoutError` from a single timer thread; a
broken connection fails every request waiting on it with :class:`TransportError`, and the next request
reconnects.

Frames the server sends on its own (NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE) go to
``on_request``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable

from broker_sim.common.errors import RequestTimeoutError, TransportError
from broker_sim.remoting.errors import FrameError
from broker_sim.remoting.frame import MAX_FRAME_BYTES, RemotingCommand, encode
from broker_sim.remoting.stream import FrameStream

log = logging.getLogger("broker_sim.remoting.client")

ReplyCallback = Callable[[RemotingCommand | BaseException], None]
#: Handles a server → client request; a returned command is sent back as the reply.
RequestHook = Callable[[RemotingCommand], RemotingCommand | None]


def _NO_CALLBACK(result: RemotingCommand | BaseException) -> None:
    """What a finished request's entry holds instead of its callback (and everything the callback holds)."""


class _Pending:
    """One request waiting for its reply (or its deadline)."""

    __slots__ = ("address", "callback", "code", "deadline", "done", "opaque")

    def __init__(
        self, deadline: float, opaque: int, callback: ReplyCallback, code: int, address: str
    ) -> None:
        self.deadline = deadline
        self.opaque = opaque
        self.callback = callback
        self.code = code
        self.address = address
        self.done = False

    @property
    def description(self) -> str:
        return f"request {self.code} to {self.address}"


class RemotingConnection:
    """A connection to ``address`` ("host:port"); thread-safe."""

    def __init__(
        self, address: str, on_request: RequestHook | None = None, connect_timeout: float = 3.0
    ) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self._target = (host, int(port))
        self._on_request = on_request
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._pending: dict[int, _Pending] = {}
        # (deadline, sequence, request): tuples compare in C, and the sequence keeps two equal deadlines from
        # ever comparing the requests themselves
        self._timeouts: list[tuple[float, int, _Pending]] = []
        self._sequence = itertools.count()
        self._timer_wakeup = threading.Condition(self._lock)
        self._closed = False
        self._timer = threading.Thread(target=self._timer_loop, name=f"remoting-timer-{address}", daemon=True)
        self._timer.start()

    # -- connection management --

    def _connected(self) -> socket.socket:
        sock = self._sock  # the common case without the lock: a socket closed meanwhile fails its write
        if sock is not None and not self._closed:
            return sock
        with self._lock:
            if self._closed:
                raise TransportError(f"connection to {self.address} is closed")
            if self._sock is not None:
                return self._sock
            try:
                sock = socket.create_connection(self._target, timeout=self._connect_timeout)
            except OSError as exc:
                raise TransportError(f"cannot connect to {self.address}: {exc}") from exc
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = sock
            threading.Thread(
                target=self._read_loop, args=(sock,), name=f"remoting-reader-{self.address}", daemon=True
            ).start()
            return sock

    def _drop(self, sock: socket.socket, reason: str) -> None:
        """Forget a broken socket and fail every request waiting on it."""
        with self._lock:
            if self._sock is sock:
                self._sock = None
            pending = list(self._pending.values())
            self._pending.clear()
        try:
            sock.close()
        except OSError:
            log.debug("closing %s failed", self.address, exc_info=True)
        for p in pending:
            self._finish(p, TransportError(f"connection to {self.address} lost: {reason}"))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sock = self._sock
            self._timer_wakeup.notify_all()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                log.debug("shutdown of %s failed", self.address, exc_info=True)
            self._drop(sock, "closed")

    # -- requests --

    def invoke_async(self, cmd: RemotingCommand, callback: ReplyCallback, timeout_s: float) -> None:
        """Send ``cmd``; ``callback`` gets exactly one reply or exception, from a library thread."""
        p = _Pending(time.monotonic() + timeout_s, cmd.opaque, callback, cmd.code, self.address)
        try:
            sock = self._connected()
        except TransportError as exc:
            callback(exc)
            return
        with self._lock:
            self._pending[cmd.opaque] = p
            timeouts = self._timeouts
            # The timer sleeps until the earliest deadline; wake it only when this one is earlier (requests of
            # one timeout come in deadline order, so a stream of sends wakes it once, not once per send).
            if not timeouts or p.deadline < timeouts[0][0]:
                self._timer_wakeup.notify()
            heapq.heappush(timeouts, (p.deadline, next(self._sequence), p))
        try:
            data = encode(cmd)
            with self._write_lock:
                sock.sendall(data)
        except (OSError, FrameError) as exc:
            with self._lock:
                self._pending.pop(cmd.opaque, None)
            self._finish(p, TransportError(f"send to {self.address} failed: {exc}"))
            if isinstance(exc, OSError):
                self._drop(sock, str(exc))

    def invoke(self, cmd: RemotingCommand, timeout_s: float) -> RemotingCommand:
        # A bare lock as a one-shot signal: cheaper than an Event (no Condition), and this is on the path of
        # every synchronous request.
        done = threading.Lock()
        done.acquire()
        box: list[RemotingCommand | BaseException] = []

        def callback(result: RemotingCommand | BaseException) -> None:
            box.append(result)
            done.release()

        self.invoke_async(cmd, callback, timeout_s)
        done.acquire()  # the timer thread guarantees a callback by the deadline
        result = box[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def invoke_oneway(self, cmd: RemotingCommand) -> None:
        sock = self._connected()
        try:
            data = encode(cmd)
            with self._write_lock:
                sock.sendall(data)
        except OSError as exc:
            self._drop(sock, str(exc))
            raise TransportError(f"oneway send to {self.address} failed: {exc}") from exc

    # -- threads --

    @staticmethod
    def _finish(p: _Pending, result: RemotingCommand | BaseException) -> None:
        if p.done:
            return
        p.done = True
        callback, p.callback = p.callback, _NO_CALLBACK  # the heap keeps a finished entry until it is pruned
        try:
            callback(result)
        except Exception:
            log.exception("reply callback for %s failed", p.description)

    def _prune(self) -> None:
        """Drop answered requests from the head of the deadline heap (replies mostly come in deadline order),
        so it holds about what is in flight instead of every request of the last timeout period."""
        with self._lock:
            timeouts = self._timeouts
            while timeouts and timeouts[0][2].done:
                heapq.heappop(timeouts)

    def _timer_loop(self) -> None:
        while True:
            expired: list[_Pending] = []
            with self._lock:
                if self._closed and not self._timeouts:
                    return
                now = time.monotonic()
                timeouts = self._timeouts
                while timeouts and (timeouts[0][0] <= now or timeouts[0][2].done):
                    p = heapq.heappop(timeouts)[2]
                    if not p.done and self._pending.pop(p.opaque, None) is p:
                        expired.append(p)
                if self._closed and not timeouts:
                    return
                if not expired:
                    self._timer_wakeup.wait(timeouts[0][0] - now if timeouts else None)
            for p in expired:
                self._finish(p, RequestTimeoutError(f"{p.description}: no reply in time"))

    def _read_loop(self, sock: socket.socket) -> None:
        reason = "closed"
        stream = FrameStream(sock, MAX_FRAME_BYTES)
        try:
            while True:
                batch = stream.read_batch()
                if batch is None:
                    raise TransportError("connection closed by the server")
                for cmd in batch:
                    if not cmd.is_response:
                        self._server_request(cmd)
                        continue
                    with self._lock:
                        p = self._pending.pop(cmd.opaque, None)
                    if p is None:
                        log.debug("%s: reply for unknown opaque %d (timed out?)", self.address, cmd.opaque)
                        continue
                    self._finish(p, cmd)
                self._prune()
        except (OSError, TransportError, FrameError) as exc:
            reason = str(exc)
        finally:
            self._drop(sock, reason)

    def _server_request(self, cmd: RemotingCommand) -> None:
        if self._on_request is None:
            log.debug("%s: ignoring server request %d", self.address, cmd.code)
            return
        if cmd.is_oneway:
            self._handle(cmd)
        else:  # a request that wants a reply may take a while (a listener runs): not on the reader thread
            threading.Thread(target=self._handle, args=(cmd,), name="server-request", daemon=True).start()

    def _handle(self, cmd: RemotingCommand) -> None:
        assert self._on_request is not None
        try:
            reply = self._on_request(cmd)
        except Exception:
            log.exception("%s: handling server request %d failed", self.address, cmd.code)
            reply = None if cmd.is_oneway else cmd.reply(1, f"the client failed to handle request {cmd.code}")
        if reply is None or cmd.is_oneway:
            return
        try:
            self.invoke_oneway(reply)
        except TransportError as exc:
            log.warning("%s: reply to server request %d not sent: %s", self.address, cmd.code, exc)
