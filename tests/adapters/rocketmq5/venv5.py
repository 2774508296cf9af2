"""The second virtualenv the RocketMQ 5.x tests run the official client in.

``rocketmq-python-client`` (5.x) and the 4.x client ``rocketmq`` 0.4.4 both install a top-level ``rocketmq``
package, so the project venv keeps 0.4.4 and the 5.x client lives in a venv built here, once, under the
tree's ``var/`` (``var/rmq5-venv/5.1.2``, rebuilt when the client version or pyproject.toml changes), with
this project installed editable (``pip install -e .``: no extras, so no 4.x client) — the 5.x driver and
the ``reliable`` workers run in it as subprocesses. The broker (and its gRPC front end) runs in the project
venv and loads the generated protocol modules from this venv's site-packages (``BROKER_SIM_RMQ5_PROTOCOL``).
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
from pathlib import Path

CLIENT_VERSION = "5.1.2"
ROOT = Path(__file__).resolve().parents[3]
EXTRA_PACKAGES = ("psycopg[binary]>=3.1",)


def venv_dir() -> Path:
    return ROOT / "var" / "rmq5-venv" / CLIENT_VERSION


def python() -> Path:
    return venv_dir() / "bin" / "python"


def site_packages() -> Path:
    lib = venv_dir() / "lib"
    return next(lib.glob("python3*/site-packages"))


def _stamp_text() -> str:
    """What the venv was built from: the client version and the project's dependency list."""
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    return f"{CLIENT_VERSION} {digest} {' '.join(EXTRA_PACKAGES)}"


def ensure_venv() -> Path:
    """Build the venv unless one built from the same inputs exists (the stamp is written last)."""
    target = venv_dir()
    stamp = target / ".complete"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{CLIENT_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.is_file() or stamp.read_text() != _stamp_text():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(target)], check=True)
            pip = [str(python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            subprocess.run(
                [*pip, f"rocketmq-python-client=={CLIENT_VERSION}", *EXTRA_PACKAGES, "-e", str(ROOT)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            stamp.write_text(_stamp_text())
    return python()
