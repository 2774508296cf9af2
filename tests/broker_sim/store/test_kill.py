"""SIGKILL a writer process in the middle of a burst (both flush modes) or of a config-file rewrite, then
check what a restart finds. The child reports acknowledged work through a file; we poll it with a timeout."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from broker_sim.store import MessageStore, StoreConfig
from broker_sim.store.config_files import load_consumer_offsets
from broker_sim.store.message_record import verify_record

REPO = Path(__file__).resolve().parents[3]


def run_until(args: list[str], ack: Path, lines: int, timeout: float = 60.0) -> list[str]:
    """Start the child, wait until it acknowledged ``lines`` items, SIGKILL it; return the acks."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.broker_sim.store.child_writer", *args], cwd=REPO)
    tick = threading.Event()
    try:
        for _ in range(int(timeout / 0.02)):
            if ack.exists() and ack.read_bytes().count(b"\n") >= lines:
                break
            if proc.poll() is not None:
                pytest.fail(f"child exited early with {proc.returncode}")
            tick.wait(0.02)
        else:
            pytest.fail("child did not acknowledge enough work in time")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    text = ack.read_text()
    return text[: text.rfind("\n") + 1].splitlines()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_sigkill_mid_burst(tmp_path: Path, mode: str) -> None:
    store_dir, ack = tmp_path / "store", tmp_path / "acks"
    acks = run_until(["burst", str(store_dir), mode, str(ack)], ack, 400 if mode == "SYNC" else 3000)
    assert (store_dir / "abort").exists()
    store = MessageStore(store_dir, StoreConfig(commit_log_file_size=64 * 1024, consume_queue_units=64,
                                               index_hash_slots=256, index_max_entries=512))  # fmt: skip
    rep = store.start()
    try:
        assert rep.abnormal
        # every acknowledged record is there, byte-identical in its key fields
        for line in acks:
            i, off, size = map(int, line.split())
            ext = store.look_message_by_offset(off)
            assert ext is not None and ext.store_size == size, f"acked message {i} lost"
            assert ext.body.startswith(b"msg-%08d|" % i) and ext.queue_id == i % 3
        # the tail is consistent: records chain without gaps up to max_phy_offset and verify
        cl = store.commit_log
        pos, count = cl.min_offset, 0
        while pos < store.max_phy_offset:
            mf = cl.mfq.find(pos)
            assert mf is not None
            local = pos - mf.file_from_offset
            size, magic = int.from_bytes(mf.mm[local : local + 4], "big"), mf.mm[local + 4 : local + 8]
            if magic == bytes.fromhex("CBD43194"):
                pos = mf.end_offset
                continue
            assert verify_record(mf.mm, local, mf.file_size, pos) is None
            pos += size
            count += 1
        assert pos == store.max_phy_offset and count >= len(acks)
        # queues and index were rebuilt to match
        assert sum(store.get_max_offset_in_queue("Burst", q) for q in range(3)) == count
        for q in range(3):
            n = store.get_max_offset_in_queue("Burst", q)
            last = store.get_message("g", "Burst", q, n - 1, 1).messages[0].ext
            assert last.queue_offset == n - 1 and last.queue_id == q
        i_last = int(acks[-1].split()[0])
        assert [m.ext.body[:13] for m in store.query_message("Burst", f"key{i_last}").messages] == [
            b"msg-%08d|" % i_last
        ]
    finally:
        store.shutdown()


@pytest.mark.slow
def test_config_file_survives_kill_during_write(tmp_path: Path) -> None:
    cfg_dir, ack = tmp_path / "config", tmp_path / "acks"
    acks = run_until(["config", str(cfg_dir), str(ack)], ack, 150)
    last = int(acks[-1])
    table = load_consumer_offsets(cfg_dir)  # never raises: the file or its .bak is whole
    assert len(table) == 50
    version = table["T0@G"][0]
    assert last <= version <= last + 1
    assert all(v == {0: version, 1: 2 * version} for v in table.values())
