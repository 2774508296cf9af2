"""d1–d3: the Spark reconciliation (``local[2]``) vs the same report in DuckDB, on a two-group fan-out.

d1: Spark job time ÷ DuckDB (2 threads) on the same Parquet files, in the same round; *cold* = the first job
of a fresh driver process (new JVM), *warm* = the second job in that session; targets ≤ 5× cold, ≤ 3× warm.
d2: Spark session start-up ÷ (start-up + first job); target ≤ 25 %. d3 (two invocations): warm time at 10 M
messages ÷ at 1 M; target ≤ 10. Rounds are interleaved (DuckDB, then a fresh Spark process, per round) and
the medians reported, each round with the load average it started under. Every round also checks that both
engines found the same counts — totals, duplicates by cause and every group's figures; after the rounds the
job's overall percentiles (last round) are checked against the exact nearest-rank ones, computed once by
DuckDB outside the timed report, within the job's stated relative error (``LATENCY_RELATIVE_ERROR``, 0.5 %).

    .venv/bin/python -m bench.bench_reconcile [--rows 3000000] [--rounds 3] [--driver-memory 4g]

``--rows`` is the number of *messages* (``message_stub`` rows); with two groups per topic the report's
subject, the (group, message) pairs, is twice that, and the log about 2.1× (``bench/reconcile_data.py``).
The generated inputs are cached in ``bench/results/reconcile-<version>-<rows>/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import reconcile_data as data
from bench import reconcile_duckdb as ref

RESULTS = Path(__file__).resolve().parent / "results"
RUNS_PER_SESSION = 2  # cold, then warm


def _peak_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def spark_round(directory: Path, rows: int, master: str, driver_memory: str) -> dict[str, Any]:
    """One fresh Spark session: start-up, a cold and a warm job; the figures and the report's counts."""
    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig, Thresholds
    from reliable.reconcile.runner import Progress, reconcile

    cfg = ReconcileConfig(as_of=data.as_of(rows))
    t0 = time.perf_counter()
    spark = io.build_session(master, driver_memory=driver_memory)
    startup = time.perf_counter() - t0
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
    runs: list[float] = []
    stages: list[dict[str, float]] = []
    summary: dict[str, Any] = {}
    for _ in range(RUNS_PER_SESSION):
        out = RESULTS / f"reconcile-{data.VERSION}-{rows}-out-spark"
        shutil.rmtree(out, ignore_errors=True)
        progress = Progress(8, stream=sys.stderr)
        t = time.perf_counter()
        result = reconcile(
            spark,
            io.read_parquet(spark, directory, cfg),
            out,
            cfg,
            Thresholds(),
            source=str(directory),
            progress=progress,
        )
        runs.append(time.perf_counter() - t)
        stages.append({k: round(v, 2) for k, v in progress.timings.items()})
        summary = result.summary
    peak = _peak_rss_mib(jvm_pid)
    spark.stop()
    return {
        "startup_s": startup,
        "runs_s": runs,
        "stages_s": stages,
        "peak_rss_mib": peak,
        "report": ref.spark_view(summary),
    }


def _duck_round(directory: Path, rows: int) -> tuple[float, dict[str, Any]]:
    from reliable.reconcile.config import ReconcileConfig

    cfg = ReconcileConfig(as_of=data.as_of(rows))
    out = RESULTS / f"reconcile-{data.VERSION}-{rows}-out-duckdb"
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    report = ref.reference_report(directory, out, cfg.as_of, cfg.grace_s, cfg.stuck_after_s)
    return time.perf_counter() - t, report


def _spark_subprocess(args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "bench.bench_reconcile",
        "--spark-round",
        "--rows",
        str(args.rows),
        "--master",
        args.master,
        "--driver-memory",
        args.driver_memory,
    ]
    done = subprocess.run(
        cmd, check=True, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _same(spark: dict[str, Any], duck: dict[str, Any]) -> bool:
    return all(spark[k] == duck[k] for k in ("totals", "duplicates_by_cause", "groups"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_reconcile")
    ap.add_argument(
        "--rows", type=int, default=3_000_000, help="messages (stubs); inbox rows = 2×, logs ≈ 2.1×"
    )
    ap.add_argument("--rounds", type=int, default=3, help="interleaved DuckDB + fresh-Spark rounds (median)")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--spark-round", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    directory = RESULTS / f"reconcile-{data.VERSION}-{args.rows}"
    if args.spark_round:
        print(json.dumps(spark_round(directory, args.rows, args.master, args.driver_memory)))
        return 0
    if not (directory / "message_log.parquet").exists():
        t = time.perf_counter()
        counts = data.generate(directory, args.rows)
        print(f"generated {counts} in {time.perf_counter() - t:.1f}s → {directory}", flush=True)

    rounds: list[dict[str, Any]] = []
    agree = True
    for i in range(args.rounds):
        load = os.getloadavg()[0]
        duck_s, duck = _duck_round(directory, args.rows)
        spark = _spark_subprocess(args)
        cold, warm = spark["runs_s"][0], spark["runs_s"][-1]
        same = _same(spark["report"], duck)
        agree = agree and same
        rounds.append(
            {
                "load_1m": round(load, 2),
                "duckdb_s": round(duck_s, 2),
                "spark_startup_s": round(spark["startup_s"], 2),
                "spark_cold_s": round(cold, 2),
                "spark_warm_s": round(warm, 2),
                "d1_cold": round(cold / duck_s, 2),
                "d1_warm": round(warm / duck_s, 2),
                "stages_warm_s": spark["stages_s"][-1],
                "peak_rss_mib": spark["peak_rss_mib"],
                "same_counts": same,
            }
        )
        print(f"round {i + 1}: {json.dumps(rounds[-1])}", flush=True)
        if not same:
            print(f"  spark:  {json.dumps(spark['report'])}\n  duckdb: {json.dumps(duck, default=str)}")
        last = (spark["report"], duck)

    def med(key: str) -> float:
        return round(float(statistics.median(r[key] for r in rounds)), 2)

    from reliable.reconcile.rollup import LATENCY_RELATIVE_ERROR

    exact = ref.exact_percentiles(directory)  # untimed: sorts every latency once
    within = all(
        abs(got - want) <= LATENCY_RELATIVE_ERROR * abs(want) + 1e-9
        for metric, wants in exact.items()
        for got, want in zip(last[0]["percentiles_ms"][metric], wants, strict=True)
    )
    agree = agree and within
    figures = {
        "messages": args.rows,
        "master": args.master,
        "driver_memory": args.driver_memory,
        "rounds": rounds,
        "load_1m": [r["load_1m"] for r in rounds],
        **{
            f"median_{k}": med(k)
            for k in ("duckdb_s", "spark_startup_s", "spark_cold_s", "spark_warm_s", "d1_cold", "d1_warm")
        },
        "d2_startup_share": round(med("spark_startup_s") / (med("spark_startup_s") + med("spark_cold_s")), 3),
        "same_counts": agree,
        "totals": last[1]["totals"],
        "duplicates_by_cause": last[1]["duplicates_by_cause"],
        "percentiles_ms": {
            "spark": last[0]["percentiles_ms"],
            "duckdb": last[1]["percentiles_ms"],
            "exact": exact,
        },
        "percentiles_within_error": within,
    }
    print(json.dumps(figures, indent=2, default=str))
    print(
        f"d1 spark/duckdb = {figures['median_d1_warm']}x warm, {figures['median_d1_cold']}x cold "
        f"(targets <= 3x, <= 5x), median of {args.rounds} rounds, load {figures['load_1m']}; "
        f"warm {figures['median_spark_warm_s']}s at {args.rows} messages; counts agree and percentiles "
        f"within {LATENCY_RELATIVE_ERROR:.1%} of the exact ones: {agree}"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
