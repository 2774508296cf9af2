"""A consumer that cannot start stops ``reliable demo`` at once, with one line that says which and why.

Without a cap the demo replaced the dying workers until its settle timeout and then reported only that the
pipeline "did not settle". The start-up bug here is real: every ``python -m reliable.demo.worker`` process
fails to import its handlers before it consumes anything (a ``sitecustomize`` on ``PYTHONPATH`` breaks
that import in worker processes only; the demo itself and the broker it starts are not affected).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reliable.demo.crashloop import LIMIT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]

BROKEN_WORKER = """
import sys


class BrokenHandlers:
    def find_spec(self, name, path=None, target=None):
        if name == "reliable.demo.groups":
            raise RuntimeError("injected start-up bug: handler module failed to load")
        return None


if any("reliable.demo.worker" in arg for arg in sys.orig_argv):
    sys.meta_path.insert(0, BrokenHandlers())
"""


def test_a_worker_that_fails_at_start_up_stops_the_demo_with_one_line(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(BROKEN_WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")])}
    demo = [sys.executable, "-m", "reliable.cli", "demo", "--workdir", str(tmp_path / "w")]
    argv = [*demo, "--messages", "50", "--consumers", "2", "--groups", "1", "--no-report", "--timeout", "900"]
    # far below --timeout: without the cap the demo would replace workers for 900 s and hit this limit
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=REPO, env=env)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("reliable: error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    line = errors[0]
    assert f"{LIMIT} consumer workers in a row died" in line
    assert "last consumer-" in line  # names the worker …
    assert (
        "exit code 1: RuntimeError: injected start-up bug: handler module failed to load" in line
    )  # … and why
    assert "did not settle" not in done.stderr
