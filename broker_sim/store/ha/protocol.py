"""The HA wire format (HAConnection / HAClient): two frame shapes, big-endian, no framing beyond them.

slave → master, repeated: the slave's commit-log max offset (its acknowledgement)::

    +-----------------------+
    | int64 slave max offset|
    +-----------------------+

master → slave, repeated: a header, then ``size`` commit-log bytes starting at ``offset``::

    +---------------------+--------------+------------------------+
    | int64 phys offset   | int32 size   | size bytes of the log  |
    +---------------------+--------------+------------------------+

``size`` 0 is a heartbeat. broker_sim cuts transfers at record boundaries (Java cuts at 32 KiB
whatever falls there); the bytes are the same, a slave just never holds half a record.
"""

from __future__ import annotations

import socket
import struct

ACK = struct.Struct(">q")
TRANSFER_HEADER = struct.Struct(">qi")

#: MessageStoreConfig defaults
TRANSFER_BATCH_BYTES = 32 * 1024  # haTransferBatchSize
HEARTBEAT_INTERVAL_S = 5.0  # haSendHeartbeatInterval
HOUSEKEEPING_S = 20.0  # haHousekeepingInterval: a silent connection is closed
SLAVE_FALLBEHIND_MAX = 256 * 1024 * 1024  # haSlaveFallbehindMax


class HAConnectionClosed(Exception):
    """The peer closed the connection, or it went silent past the housekeeping interval."""


def read_exact(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes. A socket timeout before the first byte propagates (the caller's idle tick); once a frame
    has started it is read to its end."""
    parts: list[bytes] = []
    left = n
    while left:
        try:
            chunk = sock.recv(left)
        except TimeoutError:
            if not parts:
                raise
            continue
        except OSError as exc:
            raise HAConnectionClosed(str(exc)) from exc
        if not chunk:
            raise HAConnectionClosed("peer closed the connection")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)
