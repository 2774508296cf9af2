"""p1: the retention purge does not block consumers.

p1 — ``@idempotent_consumer`` msgs/s (new ids, defaults, PostgreSQL) while :func:`reliable.sweeper.purge_logs`
deletes ``--rows`` expired ``message_log`` rows in another process ÷ the same consumer while that process is
paused, same run. Target ≥ 0.7.

Data: ``--rows`` inbox rows with one old log row each (server-side ``generate_series``, as in b4); 1 % of the
inbox rows are PENDING and 1 % DEAD, so their log rows must survive. The purge runs in a child process with
its defaults (``--batch``/``--duty`` to change them: rows per transaction, share of time working; ``--duty 1``
is the unthrottled purge of before); the consumer runs chunks of ``--chunk`` messages,
alternately with the purge running and paused. The purge parks at a batch boundary (its ``on_batch`` and
``rest`` hooks wait while the parent asks for a pause; the parent times the paused chunk only once it has
parked): stopping the process mid-batch (``SIGSTOP``, as this bench did first) would count the stop as batch
time, and the throttle would then rest through the next "during" chunk and flatter the figure. Each
(during, paused) pair gives a ratio; the figure is their median. ``--pairs`` stops measuring early and lets
the purge finish unmeasured (``--then stop``:
ends it there instead, to keep a run short); the purge's rows/s over the time it was not parked, its batch
transactions and (when it finished) the survivors are checked at the end. ``--explain`` prints the plans of
the purge's statements (and of the guard's lookups) at full size.

    .venv/bin/python -m bench.bench_purge [--rows 10000000] [--chunk 100] [--pairs 0] [--then finish|stop]
                                          [--batch 2000] [--duty 0.5] [--passes 0.5,1,0.5] [--explain]

``--passes`` measures several times on one fill (filling 10 M rows takes minutes): each pass a new purge
child at that duty cycle, ``--pairs`` pairs, then stopped; passes at different duty cycles interleave the
throttled purge with the unthrottled one in one run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

from sqlalchemy import Engine, create_engine, delete, func, select, text

from bench.bench_core import guarded
from bench.bench_growth import SERIES, fill
from bench.bench_growth import explain as explain_guard
from bench.harness import clean_redis, database, envelopes, fresh, make_rel
from reliable import constants as C
from reliable.models import MessageLog
from reliable.sweeper.retention import PROTECTED, find_batch, purge_logs
from reliable.sweeper.selection import inbox
from reliable.sweeper.selection import log as log_t

OLD = "old"
RETENTION = dt.timedelta(days=7)  # every filled row is 30 days old


def protect(engine: Engine, rows: int) -> int:
    """Every 100th inbox row PENDING, every 100th + 50 DEAD; returns how many log rows must survive."""
    with engine.begin() as conn:
        for status, first in (("PENDING", 0), ("DEAD", 50)):
            conn.execute(
                text(
                    "UPDATE message_inbox SET status = :s WHERE consumer_group = :g AND message_id IN "
                    f"(SELECT 'fill-' || i FROM {SERIES.replace('))', '), 100)')} i)"
                ),
                {"s": status, "g": OLD, "a": first, "b": rows - 1},
            )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE message_inbox"))
        return int(
            conn.execute(text("SELECT count(*) FROM message_inbox WHERE status <> 'CONFIRMED'")).scalar_one()
        )


def explain_purge(engine: Engine, batch: int) -> None:
    now = dt.datetime.now(dt.UTC)
    cutoff = now - RETENTION
    protected = (
        select(1)
        .where(
            inbox.c.message_id == log_t.c.message_id,
            inbox.c.consumer_group == log_t.c.consumer_group,
            inbox.c.status.in_(PROTECTED),
        )
        .exists()
    )
    since = now - dt.timedelta(days=30, hours=-1)
    statements = {
        "purge: first batch": find_batch(cutoff, None, batch, protected),
        "purge: next batch (keyset)": find_batch(cutoff, since, batch, protected),
        "purge: delete": delete(log_t).where(log_t.c.id.in_(list(range(1, batch + 1))), ~protected),
    }
    with engine.connect() as conn:
        conn.exec_driver_sql("SET LOCAL max_parallel_workers_per_gather = 0")  # as purge_logs does
        for label, stmt in statements.items():
            c = stmt.compile(dialect=engine.dialect, compile_kwargs={"render_postcompile": True})
            plan = conn.exec_driver_sql(f"EXPLAIN (COSTS OFF) {c}", c.params).scalars().all()
            print(f"-- {label}\n   " + "\n   ".join(line[:150] for line in plan))
        conn.rollback()


def _purge(
    url: str, out: Any, done: Any, go: Any, parked: Any, parked_s: Any, batch: int, duty: float
) -> None:
    """Child: run the purge, report (rows, seconds, median and longest batch transaction in seconds); the
    rows purged so far are in ``done`` and the seconds spent parked in ``parked_s`` all along (the parent may
    end the purge early). Parks between batches while ``go`` is clear."""
    engine = create_engine(url)
    spans: list[float] = []

    def _park() -> None:
        if go.is_set():
            return
        t = time.perf_counter()
        parked.set()
        go.wait()
        parked.clear()
        with parked_s.get_lock():
            parked_s.value += time.perf_counter() - t

    def _batch(rows: int, took: float) -> None:
        spans.append(took)
        with done.get_lock():
            done.value += rows
        _park()

    def _rest(seconds: float) -> None:
        _park()
        time.sleep(seconds)  # the throttle's rest, in the bench as in production

    t = time.perf_counter()
    n = purge_logs(
        engine,
        now=dt.datetime.now(dt.UTC),
        retention=RETENTION,
        batch=batch,
        duty_cycle=duty,
        rest=_rest,
        on_batch=_batch,
    )
    out.put((n, time.perf_counter() - t, statistics.median(spans), max(spans)))
    engine.dispose()


def _pass(url: str, rel: Any, consumer: Any, args: argparse.Namespace, duty: float, survivors: int) -> None:
    """One measurement: a purge child at ``duty``, ``--pairs`` (during, paused) pairs, then stop or finish."""
    ctx = mp.get_context("fork")
    out: Any = ctx.Queue()
    done: Any = ctx.Value("q", 0)
    parked_s: Any = ctx.Value("d", 0.0)
    go, parked = ctx.Event(), ctx.Event()
    go.set()
    child = ctx.Process(target=_purge, args=(url, out, done, go, parked, parked_s, args.batch, duty))
    started = time.perf_counter()
    child.start()
    ratios: list[float] = []
    loads: list[float] = []

    def resume(run: bool) -> None:
        if run:
            go.set()
            return
        go.clear()
        while child.is_alive() and not parked.wait(0.5):  # until it reaches a batch boundary
            pass

    while child.is_alive() and not (args.pairs and len(ratios) >= args.pairs):
        rate = {}
        order = ("during", "paused") if len(ratios) % 2 == 0 else ("paused", "during")
        for side in order:
            resume(side == "during")
            t = time.perf_counter()
            consumer.batch_each(envelopes(fresh(side, args.chunk)))
            rate[side] = args.chunk / (time.perf_counter() - t)
        resume(True)
        if child.is_alive():
            ratios.append(rate["during"] / rate["paused"])
            loads.append(os.getloadavg()[0])
    resume(True)
    paused = float(parked_s.value)
    if args.then == "stop" and child.is_alive():
        running = time.perf_counter() - started - paused
        child.terminate()
        child.join()
        purged = int(done.value)
        print(
            f"purge: stopped after the measured pairs: {purged:,} rows in {running:.0f} s unparked = "
            f"{purged / running:,.0f} rows/s (batch {args.batch:,}, duty {duty}); at that rate "
            f"{args.rows:,} rows take {args.rows / (purged / running) / 60:.1f} min"
        )
    else:
        purged, seconds, typical, longest = out.get()
        child.join()
        with rel.engine.connect() as conn:
            left = conn.execute(
                select(func.count()).select_from(MessageLog).where(MessageLog.consumer_group == OLD)
            ).scalar_one()
        print(
            f"purge: {purged:,} rows in {seconds:.0f} s, {paused:.0f} s of it paused "
            f"(batch {args.batch:,}, duty {duty}), batch transaction median "
            f"{1000 * typical:.0f} ms, longest {1000 * longest:.0f} ms; "
            f"{left:,} log rows left (expected {survivors:,}: PENDING/DEAD evidence) "
            f"{'ok' if left == survivors else 'WRONG'}"
        )
    if ratios:
        med = statistics.median(ratios)
        print(
            f"p1 consumer msgs/s during purge ÷ paused: median {med:.2f} of {len(ratios)} pairs "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f}; load {min(loads):.2f}–{max(loads):.2f})"
            f"  target ≥ 0.7  {'ok' if med >= 0.7 else 'MISSED'}"
        )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_purge", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="expired message_log rows")
    ap.add_argument("--chunk", type=int, default=100, help="messages per timed chunk")
    ap.add_argument("--pairs", type=int, default=0, help="stop measuring after this many pairs (0: never)")
    ap.add_argument("--then", choices=["finish", "stop"], default="finish", help="after --pairs")
    ap.add_argument("--batch", type=int, default=C.DEFAULT_PURGE_BATCH, help="rows per purge transaction")
    ap.add_argument("--duty", type=float, default=C.DEFAULT_PURGE_DUTY_CYCLE, help="purge duty cycle (0, 1]")
    ap.add_argument(
        "--passes",
        help="comma-separated duty cycles: one measurement each on the same filled tables (with --pairs)",
    )
    ap.add_argument("--explain", action="store_true")
    args = ap.parse_args(argv)
    prefix = f"bench{os.getpid()}"
    with database("postgres") as url:
        rel = make_rel(url, prefix)
        try:
            took = fill(rel.engine, args.rows, group=OLD)
            survivors = protect(rel.engine, args.rows)
            print(f"filled {args.rows:,} rows per table in {took:.0f} s (load {os.getloadavg()[0]:.2f})")
            if args.explain:
                explain_guard(rel.engine)
                explain_purge(rel.engine, args.batch)
            consumer = guarded(rel, "live")
            consumer.batch_each(envelopes(fresh("warm", args.chunk)))
            duties = [float(d) for d in args.passes.split(",")] if args.passes else [args.duty]
            for duty in duties:
                print(f"-- pass: duty {duty}", flush=True)
                _pass(url, rel, consumer, args, duty, survivors)
        finally:
            clean_redis(rel.redis, prefix)
            rel.close()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
