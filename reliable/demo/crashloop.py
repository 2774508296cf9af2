"""Stop the demo at once when its consumers cannot start, instead of replacing them until the run times out.

A consumer that dies on its own is replaced (the run notes it): one crash under chaos is survivable and the
replacement catches up. But a bug that kills every worker at start-up (a bad import, a handler that cannot
load, a database it cannot reach) would have the demo start worker after worker and report, minutes later,
only that the pipeline "did not settle". So a worker that dies within :data:`EARLY_S` of its start counts
as a start-up failure, and after :data:`LIMIT` of them in a row (a worker that lived longer resets the
count) the demo stops with one line naming the last worker and how it ended — its exit code or signal and
the last line of its log (the exception, usually). Chaos kills never reach this: the chaos thread takes its
victim out of the slots before killing it and starts the replacement itself (reliable/demo/faults.py).
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path

from reliable.demo.errors import DemoError

#: a worker that dies this soon after its start did not get going: a start-up failure
EARLY_S = 10.0
#: start-up failures in a row that stop the demo
LIMIT = 3


class WorkerCrashLoopError(DemoError):
    """Consumers keep dying at start-up: replacing them again would only delay the failure."""


def exit_reason(returncode: int | None, log_path: Path | None) -> str:
    """``exit code 1: RuntimeError: …`` / ``killed by SIGSEGV``: how a worker process ended."""
    if returncode is None:
        how = "stopped"
    elif returncode < 0:
        try:
            how = f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"killed by signal {-returncode}"
    else:
        how = f"exit code {returncode}"
    last = _last_line(log_path) if log_path is not None else ""
    return f"{how}: {last}" if last else how


def _last_line(path: Path) -> str:
    """The last non-blank line of a worker's log (its tail only: logs of long runs are large)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            tail = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


@dataclass
class CrashLoopGuard:
    """Counts consecutive start-up failures of replaced workers; raises once there are ``limit``."""

    early_s: float = EARLY_S
    limit: int = LIMIT
    in_a_row: int = 0

    def died(self, name: str, started_at: float, reason: str, now: float | None = None) -> None:
        """Record that worker ``name`` (started at monotonic ``started_at``) died on its own."""
        lived = (time.monotonic() if now is None else now) - started_at
        if lived >= self.early_s:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        if self.in_a_row >= self.limit:
            raise WorkerCrashLoopError(
                f"{self.in_a_row} consumer workers in a row died within {self.early_s:.0f} s of starting; "
                f"last {name} after {lived:.1f} s ({reason}); stopping the demo instead of replacing it again"
            )
