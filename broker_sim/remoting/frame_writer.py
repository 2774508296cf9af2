"""The write side of one client socket: frames leave in the order they were handed over, several per
system call when they come in runs.

Why: a producer with a window of async sends in flight handed each frame to ``sendall`` itself — one system
call, one loopback delivery and one wake-up of the server's reader per message, and in CPython one release
of the GIL per message, which the connection's reader thread took each time, so the two threads traded the
GIL once per send. :meth:`FrameWriter.post` queues the frame instead; every :data:`RUN` queued frames the
sending thread writes them with one call (so the server gets work in steady pieces while the sender goes
on), and a shorter tail is left to the writer thread, which runs as soon as the sender waits (for a window
slot, a reply or anything else). Handing *every* frame to the writer thread was tried first: it saved as
much CPU, but the sender then built its whole burst before the writer could run, the server idled
meanwhile, and a 64-window producer got ~20 % slower on an idle machine. :meth:`FrameWriter.write` serves
callers that wait for a reply anyway: it writes from the caller's thread, after whatever is queued.

Whoever writes (the writer thread or a caller) owns the socket's write side until the queue is empty, and
flushes what others queued meanwhile. A failed write closes the writer; frames still queued are dropped,
and the owner of the socket (:class:`~broker_sim.remoting.client.RemotingConnection`) fails every request
waiting on it, as for any lost connection.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("broker_sim.remoting.frame_writer")

#: frames queued by :meth:`FrameWriter.post` that its caller writes itself
RUN = 8


class Writable(Protocol):
    """What the writer writes to: a blocking socket (or anything with its ``sendall``)."""

    def sendall(self, data: bytes, /) -> None: ...


class WriterClosedError(OSError):
    """The socket behind this writer failed or was closed; nothing more is written to it."""


class FrameWriter:
    """Ordered, coalescing writes to ``sock``. ``on_error`` runs (once, on the thread that saw it) when a
    write fails."""

    def __init__(self, sock: Writable, name: str, on_error: Callable[[OSError], None]) -> None:
        self._sock = sock
        self._on_error = on_error
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: list[bytes] = []
        self._busy = False  # a thread owns the write side (and will flush the queue before letting go)
        self._handed_over = False  # the writer thread has been asked to take the write side
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def post(self, data: bytes) -> None:
        """Queue ``data``; once ``RUN`` frames are queued and nobody is writing, write them from this thread
        (so a long run of sends reaches the server in pieces, not after the run); fewer are left to the
        writer thread, which runs as soon as this thread waits."""
        with self._lock:
            if self._closed:
                raise WriterClosedError("the connection's writer is closed")
            self._queue.append(data)
            if self._busy:
                return
            if len(self._queue) < RUN:
                if not self._handed_over:
                    self._handed_over = True
                    self._wake.notify()
                return
            self._busy = True
            queued = self._queue
            self._queue = []
        self._drain(b"".join(queued))

    def write(self, data: bytes) -> None:
        """Send ``data`` (after anything queued) from this thread when nobody is writing, raising
        ``OSError`` if that fails; otherwise queue it for whoever is."""
        with self._lock:
            if self._closed:
                raise WriterClosedError("the connection's writer is closed")
            if self._busy:
                self._queue.append(data)
                return
            self._busy = True
            if self._queue:
                self._queue.append(data)
                data = b"".join(self._queue)
                self._queue = []
        self._drain(data)

    def close(self) -> None:
        """Write nothing more; frames still queued are dropped."""
        with self._lock:
            self._closed = True
            self._queue.clear()
            self._wake.notify()

    def _drain(self, data: bytes) -> None:
        """Write ``data``, then whatever was queued meanwhile, until the queue is empty (the caller owns the
        write side)."""
        try:
            while True:
                self._sock.sendall(data)
                with self._lock:
                    if self._closed or not self._queue:
                        self._busy = False
                        return
                    queued = self._queue
                    self._queue = []
                data = queued[0] if len(queued) == 1 else b"".join(queued)
        except OSError as exc:
            with self._lock:
                self._closed = True
                self._busy = False
                self._queue.clear()
            self._on_error(exc)
            raise

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._handed_over and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                self._handed_over = False
                if self._busy or not self._queue:  # a caller is writing (and drains the queue), or did
                    continue
                self._busy = True
                queued = self._queue
                self._queue = []
            try:
                self._drain(queued[0] if len(queued) == 1 else b"".join(queued))
            except OSError as exc:
                log.debug("writer %s stopped: %s", self._thread.name, exc)
                return
