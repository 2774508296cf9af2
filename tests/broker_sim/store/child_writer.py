"""Subprocess body for the kill tests (run as ``python -m tests.broker_sim.store.child_writer``).

``burst STORE_DIR SYNC|ASYNC ACK_FILE``: append messages forever; after each acknowledged put, append
``"<index> <phys offset> <size>\\n"`` to ACK_FILE with one ``write`` (so a line is never torn).
``config CONFIG_DIR ACK_FILE``: rewrite consumerOffset.json forever with an increasing version, acking each.
The parent SIGKILLs us in the middle.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from broker_sim.store import FlushDiskType, MessageInner, MessageStore, PutMessageStatus, StoreConfig
from broker_sim.store.config_files import save_consumer_offsets


def burst(store_dir: str, mode: str, ack_file: str) -> None:
    cfg = StoreConfig(
        commit_log_file_size=64 * 1024,
        consume_queue_units=64,
        index_hash_slots=256,
        index_max_entries=512,
        flush_disk_type=FlushDiskType.SYNC_FLUSH if mode == "SYNC" else FlushDiskType.ASYNC_FLUSH,
        flush_interval_commit_log_ms=20,
    )
    store = MessageStore(store_dir, cfg)
    store.start()
    fd = os.open(ack_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    i = 0
    while True:
        body = b"msg-%08d|" % i + bytes([i % 251]) * (i % 700)
        r = store.put_message(MessageInner("Burst", body, queue_id=i % 3, properties={"KEYS": f"key{i}"}))
        if r.status is PutMessageStatus.PUT_OK and r.append_result is not None:
            os.write(fd, b"%d %d %d\n" % (i, r.append_result.wrote_offset, r.append_result.wrote_bytes))
        i += 1


def config(config_dir: str, ack_file: str) -> None:
    fd = os.open(ack_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    version = 0
    while True:
        version += 1
        table = {f"T{q}@G": {0: version, 1: version * 2} for q in range(50)}
        save_consumer_offsets(Path(config_dir), table)
        os.write(fd, b"%d\n" % version)


if __name__ == "__main__":
    if sys.argv[1] == "burst":
        burst(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        config(sys.argv[2], sys.argv[3])
