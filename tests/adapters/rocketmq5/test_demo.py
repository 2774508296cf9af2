"""``reliable demo --broker rocketmq5``: runs in a venv with the 5.x client; elsewhere a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_demo_through_the_grpc_front_end_applies_every_order_once(rmq5_python: Path, tmp_path: Path) -> None:
    r = subprocess.run(
        [str(rmq5_python), "-m", "reliable.cli", "demo", "--broker", "rocketmq5", "--messages", "60",
         "--consumers", "2", "--workdir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=200, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["ok"] and summary["applied"] == 60 and summary["double_applied"] == 0


def test_demo_rocketmq5_beside_the_4x_client_is_a_one_line_error(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "reliable.cli", "demo", "--broker", "rocketmq5", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    [line] = r.stderr.strip().splitlines()
    assert "needs rocketmq-python-client" in line
