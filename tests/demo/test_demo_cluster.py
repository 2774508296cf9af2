"""``reliable demo --brokers 2 --slaves 1``: the whole pipeline against a broker_sim cluster — a name server
and two broker groups of a master and a slave, every one its own process — reached through the name server
with the same adapters. The assertions are the promise, per consumer group (every order applied exactly
once, nothing lost, the ledger balanced), plus what shows that the cluster really carried the run: both
groups acknowledged sends, a dead master's sends went to the other group, a SYNC_MASTER without its slave
answered SLAVE_NOT_AVAILABLE / FLUSH_SLAVE_TIMEOUT and nothing was lost for it.

A cluster run costs a few seconds; the chaos runs ~30 s each on a loaded 2-core machine.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.demo.test_demo_e2e import REPO, assert_promise_kept, run_demo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CLUSTER = ("--brokers", "2", "--slaves", "1", "--consumers", "2", "--no-report")


def _losses(s: dict[str, Any], kind: str) -> list[str]:
    return [f["detail"] for f in s["fault_log"] if f["kind"] == kind and f["injected"]]


def test_cluster_demo_applies_every_order_once_per_group(tmp_path: Path) -> None:
    code, s, err = run_demo(tmp_path, *CLUSTER, "--messages", "200")
    assert_promise_kept(code, s, err, 200)
    assert s["mode"] == "cluster"
    # the producer spread the orders over both broker groups, and each acknowledged them (ASYNC_MASTER)
    assert s["send_answers"].get("broker-a:SUCCESS", 0) > 0, s["send_answers"]
    assert s["send_answers"].get("broker-b:SUCCESS", 0) > 0, s["send_answers"]


def test_chaos_master_loss_on_an_async_cluster_keeps_the_promise(tmp_path: Path) -> None:
    """Each group's master loses power once (its slave lagging just before: the unreplicated window);
    production goes on to the other group, consumers read the dead group from its slave, the master
    restarts; whatever was acknowledged and lost is found by the sweeper and sent again."""
    code, s, err = run_demo(tmp_path, *CLUSTER, "--messages", "500", "--chaos", "--seed", "3")
    assert_promise_kept(code, s, err, 500)
    losses = _losses(s, "master_loss")
    assert len(losses) >= 1, s["fault_log"]
    for detail in losses:
        dead = detail.split()[0]
        meanwhile = detail.split("sends answered meanwhile: ")[1]
        # while a master was down, no send to its group was acknowledged: they went to the other group
        assert f"{dead} SUCCESS" not in meanwhile, detail
    assert any(re.search(r"broker-[ab] SUCCESS ×\d+", d.split("meanwhile: ")[1]) for d in losses), losses
    # no count of duplicates is required: every fault here may or may not redeliver (a lost ACK's message is
    # often confirmed before its resend is due), and since slaves keep a reader's offset as RocketMQ's do, a
    # run can see none; what is required is that none was applied twice (assert_promise_kept)


def test_slave_loss_under_sync_master_loses_nothing(tmp_path: Path) -> None:
    """Under SYNC_MASTER a send is acknowledged only once a slave has it: with the slave down its master
    answers SLAVE_NOT_AVAILABLE (11) / FLUSH_SLAVE_TIMEOUT (12) — the message stored, not replicated. The
    producer records it as sent, so the stub is not lost, and the promise holds."""
    code, s, err = run_demo(
        tmp_path, *CLUSTER, "--replication", "sync", "--messages", "500", "--chaos", "--seed", "5"
    )
    assert_promise_kept(code, s, err, 500)
    losses = _losses(s, "slave_loss")
    assert losses, s["fault_log"]
    for detail in losses:
        dead = detail.split()[0]
        meanwhile = detail.split("sends answered meanwhile: ")[1]
        # Whether the producer sent to that group during the outage depends on timing (production may be
        # over, or latency fault tolerance may route around the group); when it did, the master said that
        # the message was stored but not replicated.
        if f"{dead} " in meanwhile:
            assert re.search(rf"{dead} (SLAVE_NOT_AVAILABLE|FLUSH_SLAVE_TIMEOUT) ×\d+", meanwhile), detail
    assert "SYNC_MASTER" in " ".join(s["notes"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--brokers", "2", "--mode", "inprocess"], "not with --mode inprocess"),
        (["--replication", "sync", "--slaves", "0"], "needs a slave"),
        (["--brokers", "0"], "must be > 0"),
    ],
)
def test_bad_cluster_flags_are_one_line_errors(tmp_path: Path, args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reliable.cli", "demo", *args, "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
