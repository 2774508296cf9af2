"""b5: the guard against the commit ceiling of the same database (issue 18 item 4).

The one thing the guard cannot avoid per new message is a synchronous commit of the business write. So the
baseline is that alone: one single-row ``INSERT`` + ``COMMIT`` per message on one held connection, nothing
else. Ours: ``@idempotent_consumer`` with the defaults (Redis on), one new message per call, producer stubs
present, the handler doing the same single-row insert. Target ≥ 0.7 on PostgreSQL.

Both sides run interleaved in chunks in the same process (see :func:`bench.harness.interleaved`); the
figure is the median of ``--runs`` ratios (fresh ids each run).

``python -m bench ceiling [--n 300] [--chunks 6] [--runs 3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable, Sequence

from bench.bench_core import guarded
from bench.harness import Runner, add_stubs, envelopes, fresh, interleaved, ledger_sql, report, scratch_rel
from reliable import Envelope, Reliability


def commit_loop(rel: Reliability) -> tuple[Runner, Callable[[], None]]:
    """One held connection; per message one single-row INSERT and a COMMIT (returns run, close)."""
    conn = rel.engine.connect()
    sql = ledger_sql(rel)

    def run(envs: Sequence[Envelope]) -> None:
        for e in envs:
            with conn.begin():
                conn.exec_driver_sql(sql, (e.message_id,))

    return run, conn.close


def b5(rel: Reliability, n: int, chunks: int) -> float:
    handle = guarded(rel, "b5")
    ours_ids, base_ids = fresh("b5", n), fresh("b5base", n)
    add_stubs(rel, ours_ids, "b5")
    base, close = commit_loop(rel)
    try:
        ours_r, base_r = interleaved(
            [(handle.batch_each, envelopes(ours_ids)), (base, envelopes(base_ids))],
            chunks,
        )
    finally:
        close()
        handle.handle.close()
    return float(report("b5 postgres guard ÷ INSERT+COMMIT", ours_r, base_r, 0.7, "commit")["ratio"])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench ceiling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300, help="messages per side per run")
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    with scratch_rel("postgres", f"bench{os.getpid()}") as (rel, _):
        ratios = [b5(rel, args.n, args.chunks) for _ in range(args.runs)]
    runs = ", ".join(f"{r:.2f}" for r in ratios)
    print(f"b5 median of {len(ratios)}: {statistics.median(ratios):.2f}  (runs {runs})")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
