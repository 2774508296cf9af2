"""The ``checkpoint`` file and the ``abort`` marker.

``checkpoint`` is 4096 bytes; the first 24 hold (big-endian i64) the store timestamps of the newest record
known to be on disk in the commit log, in the consume queues, and in the index::

    0 physicMsgTimestamp | 8 logicsMsgTimestamp | 16 indexMsgTimestamp | … zero padding to 4096

After an unclean stop recovery starts from the newest commit-log segment whose first record is not newer
than the smallest of the first two (the index is rebuilt separately). ``abort`` is created empty at start
and removed by a clean shutdown.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from broker_sim.store.mapped_file import fsync_dir

CHECKPOINT = struct.Struct(">qqq")
FILE_SIZE = 4096


RECOVERY_MARGIN_MS = 3000  # RocketMQ's StoreCheckpoint.getMinTimestamp subtracts 3 s too


class StoreCheckpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        self.reload()

    def reload(self) -> None:
        """Read the file again (a restart after a crash must not trust values only held in memory)."""
        self.physic_msg_timestamp = self.logics_msg_timestamp = self.index_msg_timestamp = 0
        path = self.path
        if path.exists():
            raw = path.read_bytes()
            if len(raw) >= CHECKPOINT.size:
                (self.physic_msg_timestamp, self.logics_msg_timestamp,
                 self.index_msg_timestamp) = CHECKPOINT.unpack_from(raw, 0)  # fmt: skip

    def min_timestamp(self, with_index: bool) -> int:
        """The point every structure is durable up to (0 = nothing known: scan everything), moved back by
        ``RECOVERY_MARGIN_MS`` as RocketMQ's ``getMinTimestamp`` does. Store timestamps are milliseconds of
        the wall clock: records stamped in the checkpoint's own millisecond, or after the clock stepped back,
        may follow the record it names with their queue units unflushed, so the segment they start in must
        be scanned again (tests/broker_sim/store/test_recovery.py)."""
        m = min(self.physic_msg_timestamp, self.logics_msg_timestamp)
        if with_index:
            m = min(m, self.index_msg_timestamp)
        return max(0, m - RECOVERY_MARGIN_MS) if m > 0 else 0

    def flush(self) -> None:
        """Rewrite in place and fsync (a 4 KiB write is atomic on the page level)."""
        buf = bytearray(FILE_SIZE)
        CHECKPOINT.pack_into(
            buf, 0, self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp
        )
        existed = self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, bytes(buf), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        if not existed:
            fsync_dir(self.path.parent)


class AbortFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def exists(self) -> bool:
        return self.path.exists()

    def create(self) -> None:
        self.path.touch()
        fsync_dir(self.path.parent)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        fsync_dir(self.path.parent)
