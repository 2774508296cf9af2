"""d1–d2: the Spark reconciliation on 10M stubs / ~10.5M logs (Parquet) vs the same report in DuckDB.

d1: warm Spark job time (``local[2]``, second run in the same session) ÷ DuckDB (2 threads) on the same
files in the same run; target ≤ 3×. d2: Spark session start-up ÷ (start-up + first job); target ≤ 25 %.
Also printed: the driver JVM's peak resident memory (VmHWM) with ``--driver-memory`` (default 4g), and a
cross-check that both engines found the same counts.

    .venv/bin/python -m bench.bench_reconcile [--rows 10000000] [--driver-memory 4g] [--runs 2]

The generated inputs are cached in ``bench/results/reconcile-<rows>/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench import reconcile_duckdb as ref

RESULTS = Path(__file__).resolve().parent / "results"


def _peak_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_reconcile")
    ap.add_argument("--rows", type=int, default=10_000_000, help="stubs to generate (logs ≈ 1.05×)")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--runs", type=int, default=2, help="Spark runs in one session (the last is 'warm')")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)

    data = RESULTS / f"reconcile-{args.rows}"
    if not (data / "message_log.parquet").exists():
        t = time.perf_counter()
        counts = ref.generate(data, args.rows)
        print(f"generated {counts} in {time.perf_counter() - t:.1f}s → {data}", flush=True)
    as_of = ref.BASE + dt.timedelta(milliseconds=args.rows) + dt.timedelta(days=1)

    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig, Thresholds
    from reliable.reconcile.runner import Progress, reconcile

    cfg = ReconcileConfig(as_of=as_of)
    # DuckDB first: it is quick, so a Spark run that is cut short still leaves the baseline on record
    t = time.perf_counter()
    duck = ref.reference_report(
        data, RESULTS / f"reconcile-{args.rows}-out-duckdb", as_of, cfg.grace_s, cfg.stuck_after_s
    )
    duck_s = time.perf_counter() - t
    print(f"duckdb: {duck_s:.1f}s {duck['totals']}", flush=True)

    t0 = time.perf_counter()
    spark = io.build_session(args.master, driver_memory=args.driver_memory)
    startup = time.perf_counter() - t0
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
    print(f"spark start-up {startup:.1f}s (driver pid {jvm_pid})", flush=True)
    runs: list[float] = []
    summary: dict[str, Any] = {}
    for i in range(args.runs):
        out = RESULTS / f"reconcile-{args.rows}-out-spark"
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        result = reconcile(
            spark,
            io.read_parquet(spark, data, cfg),
            out,
            cfg,
            Thresholds(),
            source=str(data),
            progress=Progress(8),
        )
        runs.append(time.perf_counter() - t)
        summary = result.summary
        print(f"spark run {i + 1}: {runs[-1]:.1f}s", flush=True)
    peak = _peak_rss_mib(jvm_pid)
    spark.stop()

    spark_totals = {k: summary["totals"][k] for k in duck["totals"]}
    agree = spark_totals == duck["totals"]
    warm = runs[-1]
    figures = {
        "rows_stubs": summary["totals"]["stubs"],
        "rows_logs": summary["totals"]["deliveries"] + summary["totals"]["orphan_logs"],
        "master": args.master,
        "driver_memory": args.driver_memory,
        "spark_startup_s": round(startup, 2),
        "spark_runs_s": [round(r, 2) for r in runs],
        "duckdb_s": round(duck_s, 2),
        "d1_ratio_cold": round(runs[0] / duck_s, 2),
        "d1_ratio_warm": round(warm / duck_s, 2) if len(runs) > 1 else None,
        "d2_startup_share": round(startup / (startup + runs[0]), 3),
        "driver_peak_rss_mib": None if peak is None else round(peak),
        "same_counts": agree,
        "spark_totals": spark_totals,
        "duckdb_totals": duck["totals"],
    }
    print(json.dumps(figures, indent=2))
    print(
        f"d1 spark/duckdb = {figures['d1_ratio_warm']}x warm, {figures['d1_ratio_cold']}x cold "
        "(target <= 3x warm); "
        f"d2 start-up share = {figures['d2_startup_share']:.1%} (target <= 25%); "
        f"driver peak RSS {figures['driver_peak_rss_mib']} MiB with {args.driver_memory}; "
        f"counts agree: {agree}"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
