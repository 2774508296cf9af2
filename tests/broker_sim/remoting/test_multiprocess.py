"""Failures that only happen across processes: a consumer SIGKILLed mid-batch, a broker restarted under load.

Everything runs as real processes: ``broker-sim serve`` (the CLI), one producer and three PushConsumers of
broker_sim's own client speaking the remoting protocol (``mp_worker.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_sim import PullConsumer
from broker_sim.common.requests import PullStatus
from broker_sim.remoting.serve_process import ServeProcess
from tests.waiting import wait_until

WORKER = Path(__file__).with_name("mp_worker.py")
ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

pytestmark = pytest.mark.slow


class Serve(ServeProcess):
    """``broker-sim serve`` logging to ``log``; every process started is registered in ``procs``, so the
    fixture kills it if a test fails. Restarts on fixed ports retry while a port is briefly taken."""

    def __init__(self, procs: list[subprocess.Popen[str]], store: Path, log: Path, *extra: str) -> None:
        super().__init__(store, *extra, log_level="INFO", stderr_path=log)
        self.procs = procs

    def start(self, namesrv_port: int = 0, broker_port: int = 0, *, attempts: int = 20) -> Serve:
        super().start(namesrv_port, broker_port, attempts=attempts)
        assert self.proc is not None
        self.procs.append(self.proc)
        return self


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)


def spawn(
    procs: list[subprocess.Popen[str]], mode: str, namesrv: str, log: Path, args: dict[str, Any]
) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, str(WORKER), mode, namesrv, str(log), json.dumps(args)],
        stderr=subprocess.DEVNULL,
        env=ENV,
        text=True,
    )
    procs.append(p)
    return p


def events(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    # a SIGKILL can leave a half-written last line: ignore it
    out = []
    for line in log.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def latest_assignment(log: Path) -> dict[str, Any] | None:
    assigned = [e for e in events(log) if e["event"] == "assigned"]
    return assigned[-1] if assigned else None


def test_consumer_killed_mid_batch(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    n = 1200
    server = Serve(procs, tmp_path / "store", tmp_path / "serve.log", "--set", 'topics={"MP": 6}')
    server.start()
    try:
        logs = [tmp_path / f"consumer{i}.jsonl" for i in range(3)]
        blocks = [log.with_suffix(".block") for log in logs]
        consumers = [
            spawn(
                procs,
                "consume",
                server.namesrv,
                log,
                {"topic": "MP", "group": "MPG", "pause_s": 0.004, "block_file": str(block)},
            )
            for log, block in zip(logs, blocks, strict=True)
        ]

        def settled() -> bool:  # all three joined and the six queues are split 2/2/2
            a = [latest_assignment(log) for log in logs]
            return all(x is not None and len(x["queues"]) == 2 for x in a) and sorted(
                q for x in a if x for q in x["queues"]
            ) == list(range(6))

        assert wait_until(settled, timeout=30)
        # kill the middle client id: with average allocation the survivors then keep their own queues and
        # only the victim's move, so every duplicate can be attributed to the kill (none to a plain rebalance)
        by_id = sorted((latest_assignment(log)["client_id"], i) for i, log in enumerate(logs))  # type: ignore[index]
        victim = by_id[1][1]
        victim_queues = set(latest_assignment(logs[victim])["queues"])  # type: ignore[index]
        producer = spawn(
            procs, "produce", server.namesrv, tmp_path / "producer.jsonl", {"topic": "MP", "count": n}
        )

        assert wait_until(
            lambda: sum(e["event"] == "delivery" for e in events(logs[victim])) >= 60, timeout=30
        )
        # Kill it inside a listener call, not merely while it consumes: a message it logged and had not
        # finished cannot have a committed offset, so at least that one must be redelivered. (Killed between
        # messages, its last pull or offset persist may have committed everything it consumed.)
        blocks[victim].touch()
        assert wait_until(lambda: any(e["event"] == "blocked" for e in events(logs[victim])), timeout=30)
        blocked = {e["body"] for e in events(logs[victim]) if e["event"] == "blocked"}
        os.kill(consumers[victim].pid, signal.SIGKILL)
        consumers[victim].wait(timeout=10)

        def consumed() -> set[str]:
            return {e["body"] for log in logs for e in events(log) if e["event"] == "delivery"}

        assert producer.wait(timeout=60) == 0
        assert wait_until(lambda: len(consumed()) == n, timeout=60), f"missing {n - len(consumed())}"
        for i, c in enumerate(consumers):
            if i != victim:
                c.send_signal(signal.SIGTERM)
                assert c.wait(timeout=30) == 0
    finally:
        assert server.stop() == 0
    deliveries = [e for log in logs for e in events(log) if e["event"] == "delivery"]
    counts = Counter(e["body"] for e in deliveries)
    assert set(counts) == {f"m{i}" for i in range(n)}  # every message at least once
    duplicates = {b: c for b, c in counts.items() if c > 1}
    victim_pid = consumers[victim].pid
    seen_by: dict[str, set[int]] = defaultdict(set)
    queue_of: dict[str, int] = {}
    for e in deliveries:
        seen_by[e["body"]].add(e["pid"])
        queue_of[e["body"]] = e["queue_id"]
    for body in duplicates:  # each duplicate: the victim had it, on one of the victim's queues
        assert victim_pid in seen_by[body] and queue_of[body] in victim_queues, body
    assert blocked <= set(duplicates), "the message the victim died in must be redelivered"
    (tmp_path / "summary.json").write_text(
        json.dumps({"messages": n, "duplicates": sum(c - 1 for c in duplicates.values())})
    )
    # the broker's committed offsets reached the end of every queue after the clean shutdowns
    assert not (tmp_path / "store" / "abort").exists()


def test_broker_restart_loses_nothing_acknowledged_under_sync_flush(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    n = 400
    server = Serve(
        procs,
        tmp_path / "store",
        tmp_path / "serve.log",
        "--flush",
        "SYNC_FLUSH",
        "--set",
        'topics={"RS": 4}',
    )
    server.start()
    ports = server.ports()
    plog = tmp_path / "producer.jsonl"
    producer = spawn(
        procs,
        "produce",
        server.namesrv,
        plog,
        {"topic": "RS", "count": n, "pause_s": 0.002, "deadline_s": 90},
    )
    assert wait_until(lambda: sum(e["event"] == "acked" for e in events(plog)) >= n // 3, timeout=60)
    server.stop(signal.SIGKILL)  # a crash, mid-stream: only what was fsynced survives
    acked_before = {e["i"] for e in events(plog) if e["event"] == "acked"}
    assert (tmp_path / "store" / "abort").exists()  # unclean stop: recovery runs at the next start
    server.start(*ports)
    try:
        assert producer.wait(timeout=90) == 0
        acked = {e["i"]: e for e in events(plog) if e["event"] == "acked"}
        assert set(acked) == set(range(n))
        assert any(e["event"] == "failed" for e in events(plog))  # the restart really was mid-stream
        pull = PullConsumer(server.namesrv, "RSCheck")
        pull.start()
        stored: dict[str, set[tuple[int, int]]] = defaultdict(set)

        def scan() -> bool:  # read every queue from 0; True once every acked message is visible
            stored.clear()
            for mq in pull.fetch_subscribe_message_queues("RS"):
                offset = 0
                while (res := pull.pull(mq, "*", offset)).status is PullStatus.FOUND:
                    for m in res.msgs:
                        stored[m.body.decode()].add((m.queue_id, m.queue_offset))
                    offset = res.next_begin_offset
            return all(f"m{i}" in stored for i in acked)

        try:
            # consume queues are rebuilt/dispatched asynchronously after the restart: poll, then check
            wait_until(scan, 30, "every acknowledged message to be visible")
        finally:
            pull.shutdown()
        for i, e in acked.items():  # every acknowledged message is there, where the ack said it was
            assert (e["queue_id"], e["offset"]) in stored[f"m{i}"], i
        # a send caught by the crash may be stored and resent (its ACK never came): a duplicate, not a loss;
        # every duplicate belongs to a message whose send the producer saw fail
        retried = {e["i"] for e in events(plog) if e["event"] == "failed"}
        dups = {body: locs for body, locs in stored.items() if len(locs) > 1}
        assert {int(b[1:]) for b in dups} <= retried, dups
        assert acked_before <= set(acked)
    finally:
        assert server.stop() == 0
    assert not (tmp_path / "store" / "abort").exists()  # SIGTERM = clean shutdown
