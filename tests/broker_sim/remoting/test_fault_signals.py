"""``broker-sim serve --fault-signals``: SIGUSR1 is a power cut that loses unflushed ASYNC_FLUSH data.

A SIGTERM stop flushes everything and a restart finds every message; a SIGUSR1 power cut drops what the
flusher had not written (here: everything sent since the last clean start, because the flush interval is an
hour), leaves the abort file, exits 137, and the restart's crash recovery finds only the flushed messages.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_sim import Message, Producer
from broker_sim.remoting.client_transport import RemotingTransport
from broker_sim.remoting.serve import POWER_CUT_EXIT, POWER_CUT_SIGNAL
from broker_sim.remoting.serve_process import ServeProcess
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
QUEUES = 2


class Server(ServeProcess):
    """``broker-sim serve`` with a small store whose periodic flushers never run during the test (only a
    clean stop flushes)."""

    def __init__(self, store: Path, *extra: str) -> None:
        super().__init__(
            store, "--flush", "ASYNC_FLUSH", "--set", f'topics={{"T": {QUEUES}}}',
            "--set", "flush_interval_commit_log_ms=3600000",
            "--set", "flush_interval_consume_queue_ms=3600000",
            "--set", "commit_log_file_size=4194304", "--set", "index_hash_slots=1000",
            "--set", "index_max_entries=4000", *extra,
        )  # fmt: skip
        self.start()

    def total_max_offset(self) -> int:
        t = RemotingTransport(self.namesrv)
        try:
            return sum(t.get_max_offset("T", q) for q in range(QUEUES))
        finally:
            t.close()

    def send(self, count: int, tag: str) -> None:
        producer = Producer(self.namesrv, "PG")
        try:
            for i in range(count):
                producer.send(Message("T", f"{tag}{i}".encode()))
        finally:
            producer.shutdown()


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for s in started:
        s.kill()


def test_sigterm_keeps_everything_and_sigusr1_loses_the_unflushed(
    tmp_path: Path, servers: list[Server]
) -> None:
    store = tmp_path / "store"

    first = Server(store, "--fault-signals")
    servers.append(first)
    first.send(6, "kept")
    assert wait_until(lambda: first.total_max_offset() == 6)
    assert first.stop(signal.SIGTERM) == 0  # a clean stop flushes: the restart finds every message
    assert not (store / "abort").exists()

    second = Server(store, "--fault-signals")
    servers.append(second)
    assert second.total_max_offset() == 6
    second.send(5, "lost")
    assert wait_until(lambda: second.total_max_offset() == 11)
    assert second.stop(POWER_CUT_SIGNAL) == POWER_CUT_EXIT
    assert (store / "abort").exists()  # an unclean stop: the next start runs crash recovery
    err = second.communicate()
    assert "power cut" in err and "Traceback" not in err

    third = Server(store)
    servers.append(third)
    assert third.total_max_offset() == 6  # the five unflushed messages are gone, the flushed six are not
    third.send(1, "after")  # the recovered store takes new messages at the recovered offsets
    assert wait_until(lambda: third.total_max_offset() == 7)
    assert third.stop(signal.SIGTERM) == 0


def test_without_the_flag_sigusr1_is_not_a_power_cut(tmp_path: Path, servers: list[Server]) -> None:
    """Off by default: SIGUSR1 keeps its default action (terminate), which skips the crash hook entirely,
    so nothing unflushed is discarded and the restart finds every message in the page cache."""
    store = tmp_path / "store"
    first = Server(store)
    servers.append(first)
    first.send(4, "m")
    assert wait_until(lambda: first.total_max_offset() == 4)
    assert first.stop(POWER_CUT_SIGNAL) == -POWER_CUT_SIGNAL
    second = Server(store)
    servers.append(second)
    assert second.total_max_offset() == 4


PARENT = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
print(child.stdout.readline().strip(), child.pid, flush=True)
os._exit(0)  # the parent dies without stopping its child, as a SIGKILLed harness would
"""


def test_exit_with_parent_stops_cleanly_when_the_parent_dies(tmp_path: Path) -> None:
    store = tmp_path / "store"
    serve = ServeProcess(store, "--exit-with-parent").command()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", PARENT, *serve], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0 and out.stdout.startswith("broker-sim ready"), (out.stdout, out.stderr)
    namesrv, pid = out.stdout.split("namesrv=")[1].split()[0], int(out.stdout.split()[-1])
    host, port = namesrv.rsplit(":", 1)

    def refused() -> bool:
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
        except OSError:
            return True
        return False

    try:
        # the orphaned server notices within a second and stops as on SIGTERM: the abort file goes away
        # and the port stops answering
        assert wait_until(lambda: not (store / "abort").exists(), timeout=30)
        assert wait_until(refused, timeout=30)
    finally:
        if not refused():  # the flag did not work: do not leave the orphan running
            os.kill(pid, signal.SIGKILL)
