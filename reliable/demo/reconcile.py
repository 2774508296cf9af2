"""The demo's last step: the Spark reconciliation of what the run left in the tables.

Run as ``reliable`` subcommands in a child process (the same commands an operator runs from cron), so the
demo exercises the shipped entry points and a JVM start-up problem cannot take the demo process down:

* SQLite: ``reliable export --to WORKDIR/export`` then ``reliable reconcile --parquet WORKDIR/export``;
* PostgreSQL / MariaDB: ``reliable reconcile --db URL`` (JDBC).

The grace period is 0: the demo only reconciles after every group's inbox row settled, so a pending row
below the watermark at that point is lost, not late. ``--max-lost 0`` and ``--max-never-consumed 0`` make the
report itself flag a loss or a group that never consumed a queue.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("reliable.demo")

#: the report's numbers the demo summary repeats (the whole file stays next to report.html)
SUMMARY_KEYS = (
    "totals", "groups", "never_consumed", "duplicates_by_cause", "latency_ms", "ok", "breaches", "elapsed_s",
)  # fmt: skip


def _reliable(*args: str) -> list[str]:
    return [sys.executable, "-m", "reliable.cli", *args]


def run_reconciliation(
    db_url: str, workdir: Path, log_dir: Path, timeout_s: float = 600.0
) -> tuple[Path | None, dict[str, Any] | None]:
    """Run the report; returns ``(report.html path, selected summary.json numbers)``.

    A failure of the report (no Java, no JDBC driver) is not a failure of the pipeline: it is logged, the
    path is ``None`` and the numbers carry the error, so the demo's verdict still rests on the ledger.
    """
    out = workdir / "report"
    log_path = log_dir / "reconcile.log"
    commands: list[list[str]] = []
    common = ["--out", str(out), "--grace", "0s", "--max-lost", "0", "--max-never-consumed", "0"]
    if db_url.startswith("sqlite"):
        export = workdir / "export"
        commands.append(_reliable("export", "--to", str(export), "--db", db_url, "-q"))
        commands.append(_reliable("reconcile", "--parquet", str(export), *common))
    else:
        commands.append(_reliable("reconcile", "--db", db_url, *common))
    with open(log_path, "ab") as sink:
        for cmd in commands:
            done = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
            if done.returncode not in (0, 2):  # 2 = a threshold crossed: the report is still written
                log.error("%s exited with %d (see %s)", " ".join(cmd[2:4]), done.returncode, log_path)
                return None, {"error": f"{cmd[3]} exited with {done.returncode}; see {log_path}"}
    summary_path = out / "summary.json"
    report = out / "report.html"
    if not summary_path.exists():
        return None, {"error": f"no summary.json in {out}; see {log_path}"}
    data = json.loads(summary_path.read_text())
    numbers = {k: data[k] for k in SUMMARY_KEYS if k in data}
    numbers["summary_json"] = str(summary_path)
    return (report if report.exists() else None), numbers
