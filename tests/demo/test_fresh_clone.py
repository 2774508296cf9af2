"""``make demo`` on a fresh checkout with a brand-new virtualenv: the two set-up commands a user runs.

The checkout is a ``git clone`` of HEAD when the working tree is clean (CI), else a copy of exactly the files
a clone of the current tree would contain (tracked plus untracked-but-not-ignored), so the test also checks
uncommitted work before it is committed. The venv is new; ``pip`` fills it from its cache (network for
anything not cached), which is what keeps this test to a couple of minutes. ``DEMO_ARGS`` makes the demo
small and skips Spark (the report path has its own test).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


def checkout(dst: Path) -> None:
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    if not status.strip():
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", f"file://{REPO}", str(dst)], check=True)
        return
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in files:
        if not raw:
            continue
        rel = raw.decode()
        src = REPO / rel
        if not src.is_file():  # deleted in the working tree
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def test_make_demo_on_a_fresh_checkout(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    src = tmp_path / "clone"
    checkout(src)
    assert (src / "Makefile").is_file() and (src / "reliable" / "demo" / "runner.py").is_file()
    work = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    args = f"--messages 200 --consumers 2 --no-report --json --workdir {work}"  # default: 2 groups
    done = subprocess.run(
        ["make", "-s", "demo", f"PYTHON={sys.base_prefix}/bin/python3", f"DEMO_ARGS={args}"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    assert summary["ok"] is True and summary["lost"] == 0 and summary["double_applied"] == 0
    assert summary["produced"] == 200 and summary["confirmed"] == 200 * 2, "both groups confirmed every order"
    # the demo really ran from the fresh checkout's own virtualenv
    assert (src / ".venv" / "bin" / "reliable").is_file()
