"""The master side of replication (RocketMQ 4.9.8 ``HAService`` + ``HAConnection``): accept slaves on the HA
port, stream each one the commit log from where it stands, and let ``SYNC_MASTER`` sends wait for a slave.

Per slave connection two threads, as in Java: a reader taking the slave's acknowledged max offsets, and
a writer sending from ``next`` onwards. The first acknowledgement says where to start; a slave that
reports 0 (an empty log) is sent the master's *last* segment from its start, as Java does — older
history is not replicated to a brand-new slave.

``acked`` is the highest offset any slave acknowledged (``push2SlaveMaxOffset``). A slave is "OK"
(``isSlaveOK``) when at least one is connected and it is no more than ``haSlaveFallbehindMax`` behind.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from enum import Enum

from broker_sim.store.commit_log import CommitLog
from broker_sim.store.ha.protocol import (
    ACK,
    HEARTBEAT_INTERVAL_S,
    HOUSEKEEPING_S,
    SLAVE_FALLBEHIND_MAX,
    TRANSFER_BATCH_BYTES,
    TRANSFER_HEADER,
    HAConnectionClosed,
    read_exact,
)

log = logging.getLogger("broker_sim.store.ha")


class ReplicaResult(Enum):
    OK = "OK"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"  # no slave connected, or one too far behind
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"  # a slave is there but did not acknowledge in time


class HAService:
    def __init__(
        self,
        commit_log: CommitLog,
        host: str,
        port: int,
        *,
        batch_bytes: int = TRANSFER_BATCH_BYTES,
        fallbehind_max: int = SLAVE_FALLBEHIND_MAX,
        announce_host: str | None = None,
    ) -> None:
        self.commit_log = commit_log
        #: the host slaves are told to connect to (brokerIP2); None: the bound one
        self.announce_host = announce_host
        self.batch_bytes = batch_bytes
        self.fallbehind_max = fallbehind_max
        self._bind = (host, port)
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._conns: set[socket.socket] = set()
        #: connections whose first offset report arrived, so their transfer start is fixed
        self._streaming: set[socket.socket] = set()
        self._appends = 0  # bumped by every append, so a writer never sleeps through one
        self.acked = 0

    @property
    def address(self) -> str:
        assert self._sock is not None, "not started"
        host, port = self._sock.getsockname()[:2]
        return f"{self.announce_host or host}:{port}"

    @property
    def slaves(self) -> int:
        """Connected slaves, including any whose first offset report has not arrived yet."""
        with self._cond:
            return len(self._conns)

    @property
    def streaming(self) -> int:
        """Slaves whose first report arrived: the offset the master sends them from is settled (a slave
        reporting 0 gets the segment the master is writing *then*, so anything written earlier in an older
        segment is never sent to it)."""
        with self._cond:
            return len(self._streaming)

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(self._bind)
        sock.listen(8)
        self._sock = sock
        threading.Thread(target=self._accept, name="ha-accept", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                log.debug("HA listener shutdown", exc_info=True)
            self._sock.close()
        with self._cond:
            conns = list(self._conns)
            self._cond.notify_all()
        for c in conns:
            _close(c)

    def notify_appended(self) -> None:
        """Wake the writers (called after every append)."""
        with self._cond:
            self._appends += 1
            self._cond.notify_all()

    # -- SYNC_MASTER --

    def slave_ok(self, master_put_offset: int) -> bool:
        with self._cond:
            return bool(self._conns) and master_put_offset - self.acked < self.fallbehind_max

    def wait_replicated(self, end_offset: int, timeout_s: float) -> ReplicaResult:
        """Block until a slave acknowledged ``end_offset`` (CommitLog.submitReplicaRequest).

        Unlike Java, which waits out ``syncFlushTimeout`` even after its last slave went away, the wait
        ends as soon as no slave is connected and the put reports SLAVE_NOT_AVAILABLE: the producer
        learns the truth at once instead of running out its own send timeout behind a dead slave."""
        if not self.slave_ok(end_offset):
            return ReplicaResult.SLAVE_NOT_AVAILABLE
        with self._cond:
            self._cond.wait_for(
                lambda: self.acked >= end_offset or not self._conns or self._stop.is_set(), timeout_s
            )
            if self.acked >= end_offset:
                return ReplicaResult.OK
            return ReplicaResult.FLUSH_SLAVE_TIMEOUT if self._conns else ReplicaResult.SLAVE_NOT_AVAILABLE

    # -- connections --

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(HOUSEKEEPING_S)
            log.info("slave %s connected", peer)
            with self._cond:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="ha-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        first = threading.Event()
        start = [0]

        def read_acks() -> None:
            try:
                while not self._stop.is_set():
                    (offset,) = ACK.unpack(read_exact(conn, ACK.size))
                    with self._cond:
                        if not first.is_set():
                            start[0] = self._start_offset(offset)
                            self._streaming.add(conn)
                            first.set()
                        if offset > self.acked:
                            self.acked = offset
                        self._cond.notify_all()
            except (HAConnectionClosed, TimeoutError) as exc:
                log.info("slave connection closed: %s", exc)
            finally:
                self._drop(conn)
                first.set()

        threading.Thread(target=read_acks, name="ha-acks", daemon=True).start()
        first.wait()
        try:
            self._write(conn, start[0])
        except (OSError, HAConnectionClosed) as exc:
            log.info("slave connection lost while sending: %s", exc)
        finally:
            self._drop(conn)

    def _start_offset(self, reported: int) -> int:
        """Where a slave's transfer starts: its own end, or, for a slave reporting 0, the start of the
        segment the master is writing now (HAConnection.WriteSocketService)."""
        if reported:
            return reported
        cl = self.commit_log
        top = cl.max_offset
        return max(cl.min_offset, top - top % cl.file_size)

    def _write(self, conn: socket.socket, nxt: int) -> None:
        cl = self.commit_log
        last_write = time.monotonic()
        while self._alive(conn):
            with self._cond:
                seen = self._appends
            data = cl.read_for_replica(nxt, self.batch_bytes)
            if data:
                conn.sendall(TRANSFER_HEADER.pack(nxt, len(data)) + data)
                nxt += len(data)
                last_write = time.monotonic()
                continue
            if cl.max_offset > nxt and cl.mfq.find(nxt) is None:
                nxt = cl.next_segment_offset(nxt)  # the next segment was already started
                continue
            if time.monotonic() - last_write >= HEARTBEAT_INTERVAL_S:
                conn.sendall(TRANSFER_HEADER.pack(nxt, 0))
                last_write = time.monotonic()
            self._wait_append(seen)

    def _wait_append(self, seen: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._appends != seen or self._stop.is_set(), 0.1)

    def _alive(self, conn: socket.socket) -> bool:
        with self._cond:
            return not self._stop.is_set() and conn in self._conns

    def _drop(self, conn: socket.socket) -> None:
        with self._cond:
            if conn not in self._conns:
                return
            self._conns.discard(conn)
            self._streaming.discard(conn)
            self._cond.notify_all()
        _close(conn)


def _close(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        log.debug("HA connection already down", exc_info=True)
    conn.close()
