"""The slave side of replication (RocketMQ 4.9.8 ``HAService.HAClient``): connect to the master's HA port,
report this log's max offset, append what the master sends at the same offsets, and report again.

The master's address comes from a callable (the broker learns it from its name-server registration, or
it is configured); while it is unknown, or the master is down, the client retries every second. A
transfer that does not continue this log exactly (the master sent from elsewhere) closes the connection,
as Java's ``dispatchReadRequest`` does; the next connection starts from this log's end again.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

from broker_sim.store.commit_log import CommitLog
from broker_sim.store.errors import MessageIllegalError
from broker_sim.store.ha.protocol import (
    ACK,
    HEARTBEAT_INTERVAL_S,
    HOUSEKEEPING_S,
    TRANSFER_HEADER,
    HAConnectionClosed,
    host_port,
    read_exact,
)

log = logging.getLogger("broker_sim.store.ha")

RECONNECT_S = 1.0


class HAClient:
    def __init__(
        self, commit_log: CommitLog, master_ha_address: Callable[[], str], on_data: Callable[[], None]
    ) -> None:
        self.commit_log = commit_log
        self.master_ha_address = master_ha_address
        self.on_data = on_data
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self.connected = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="ha-client", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._close()

    def _close(self) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
        self.connected.clear()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                log.debug("HA client socket already down", exc_info=True)
            sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            addr = self.master_ha_address()
            if addr:
                try:
                    self._session(addr)
                except (OSError, HAConnectionClosed, MessageIllegalError) as exc:
                    log.info("replication from %s stopped: %s", addr, exc)
                finally:
                    self._close()
            self._stop.wait(RECONNECT_S)

    def _session(self, addr: str) -> None:
        sock = socket.create_connection(host_port(addr), timeout=3.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(1.0)
        with self._lock:
            if self._stop.is_set():
                sock.close()
                return
            self._sock = sock
        self.connected.set()
        log.info("replicating from master %s", addr)
        cl = self.commit_log
        sock.sendall(ACK.pack(cl.max_offset))
        last_report = last_heard = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last_report >= HEARTBEAT_INTERVAL_S:
                sock.sendall(ACK.pack(cl.max_offset))
                last_report = now
            try:
                offset, size = TRANSFER_HEADER.unpack(read_exact(sock, TRANSFER_HEADER.size))
            except TimeoutError:
                if time.monotonic() - last_heard > HOUSEKEEPING_S:
                    raise HAConnectionClosed("master silent past the housekeeping interval") from None
                continue
            last_heard = time.monotonic()
            if size == 0:
                continue
            data = read_exact(sock, size)
            cl.append_replica(offset, data)
            self.on_data()
            sock.sendall(ACK.pack(cl.max_offset))
            last_report = time.monotonic()
