"""A consumer process with ``async def`` handlers SIGKILLed mid-handler (its effect written, the guard's
transaction open) and started again, behind a RocketMQ 4.x push consumer whose offsets live on the broker
(``broker-sim serve``): every message applied once, none lost, all CONFIRMED — the killed handler's write
rolled back with its transaction, its message taken again once the dead worker's lease lapsed."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reliable import Reliability
from reliable.types import StubStatus
from tests.adapters.rmq4_aio_topology import broker_server, effect_counts, make_rel, stage, statuses
from tests.waiting import wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
_slots = itertools.count(70)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def rel(server_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    r = make_rel(server_url, redis_url, key_prefix)
    yield r
    r.close()


def worker(
    rel: Reliability, redis_url: str, prefix: str, address: str, hang_on: str, ready: Path
) -> subprocess.Popen[bytes]:
    url = rel.engine.url.render_as_string(hide_password=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [
        sys.executable,
        "-m",
        "tests.adapters.rmq4_aio_worker",
        url,
        redis_url,
        prefix,
        address,
        hang_on,
        str(ready),
    ]
    return subprocess.Popen(argv, cwd=ROOT, env=env)


def test_a_worker_killed_mid_handler_and_restarted_applies_everything_once(
    rel: Reliability, redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    server = broker_server(tmp_path, next(_slots) % 50)
    server.start()
    ids = [f"s-{i:02d}" for i in range(24)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        stage(rel, server.address, ids)
        ready = tmp_path / "in-handler"
        procs.append(worker(rel, redis_url, key_prefix, server.address, "s-09", ready))
        wait_until(ready.exists, what="the worker inside the handler of s-09")
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(30)
        assert "s-09" not in effect_counts(rel, "billing")  # its write died with the transaction
        procs.append(worker(rel, redis_url, key_prefix, server.address, "-", tmp_path / "unused"))
        wait_until(
            lambda: set(effect_counts(rel, "billing")) == set(ids), what="billing applied", timeout=120
        )
        wait_until(
            lambda: statuses(rel, "billing").get("s-09") is StubStatus.CONFIRMED, what="s-09 confirmed"
        )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        server.stop()
    assert effect_counts(rel, "billing") == dict.fromkeys(ids, 1)
    assert statuses(rel, "billing") == dict.fromkeys(ids, StubStatus.CONFIRMED)
