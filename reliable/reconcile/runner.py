"""One reconciliation run: transforms → detail Parquet → collected aggregates → summary.json → report.html.

The intermediate DataFrames every output depends on (classified deliveries, the pair/delivery join) are
persisted once and materialised in the first stage, so the small actions that follow reuse them instead of
reading and shuffling the inputs again; the aggregations are plain hash aggregations per queue, whose group
and overall rows (and percentiles, from a mergeable log-bucket sketch) are summed on the driver. Detail
tables are written next and their counts and attention lists are read back from the (small) written files.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from reliable.reconcile import aggregates as A
from reliable.reconcile import io, rollup
from reliable.reconcile import transforms as T
from reliable.reconcile.config import ORPHAN_BROADCAST_ROWS, ReconcileConfig, Thresholds
from reliable.reconcile.gaps import offset_gaps
from reliable.reconcile.inputs import in_log_window, in_minute_window
from reliable.reconcile.orphans import orphan_candidates, orphan_logs
from reliable.reconcile.report_html import render_html
from reliable.reconcile.summary import ATTENTION_KINDS, Collected, build_summary, headline
from reliable.reconcile.timeline import timeline_frame

DETAIL_TABLES = ("lost", "stuck", "dead", "unsent", "duplicates", "orphans", "gaps")


@dataclass(frozen=True)
class RunResult:
    summary: dict[str, Any]
    out_dir: Path
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return bool(self.summary["ok"])


class Progress:
    """Numbered stage lines on the console (stderr), with the time each stage took."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total, self.stream, self.enabled = total, stream or sys.stderr, enabled
        self.n = 0
        self._t = time.perf_counter()

        self.timings: dict[str, float] = {}
        self._what: str | None = None

    def _close(self) -> None:
        now = time.perf_counter()
        if self._what is not None:
            self.timings[self._what] = now - self._t
            if self.enabled:
                print(f"reconcile:       {now - self._t:6.2f}s", file=self.stream, flush=True)
        self._t = now

    def step(self, what: str) -> None:
        self._close()
        self.n += 1
        self._what = what
        if self.enabled:
            print(f"reconcile [{self.n}/{self.total}] {what}", file=self.stream, flush=True)

    def done(self, what: str) -> None:
        self._close()
        self._what = None
        if self.enabled:
            print(f"reconcile: {what}", file=self.stream, flush=True)


def _rows(df: DataFrame) -> list[Mapping[str, Any]]:
    return [r.asDict() for r in df.collect()]


def _read_back(back: Mapping[str, DataFrame], cfg: ReconcileConfig, c: Collected) -> None:
    """Everything the summary needs from the written detail tables, in one job (one collect).

    Duplicates per delivered queue and cause, orphan logs and gaps per queue, and per attention kind how many
    distinct (group, message) pairs it holds and the first ``attention_limit`` of them (a ranked window:
    Spark keeps only N rows per kind while sorting, never a set of every id in one task). The parts are
    tagged rows of one schema, unioned and collected together: each was its own small job before, and on
    ``local[2]`` their fixed costs (about ten jobs) were 5 s of the run.
    """
    none = {"cause": "string", "message_id": "string", "n": "long", "m": "long"}
    none.update({k: "string" for k in ("consumer_group", "topic", "broker_name")} | {"queue_id": "int"})

    def tagged(df: DataFrame, tag: str) -> DataFrame:
        cols = [(F.col(k) if k in df.columns else F.lit(None)).cast(t).alias(k) for k, t in none.items()]
        return df.select(F.lit(tag).alias("tag"), *cols)

    ids = None
    for name in ATTENTION_KINDS:
        part = back[name].select(F.col("consumer_group"), "message_id", F.lit(name).alias("cause"))
        ids = part if ids is None else ids.unionByName(part)
    assert ids is not None
    distinct_ids = ids.distinct()
    rank = F.row_number().over(Window.partitionBy("cause").orderBy("consumer_group", "message_id"))
    parts = [
        back["duplicates"]
        .groupBy(*T.QUEUE_KEY, "cause")
        .agg(F.count(F.lit(1)).alias("n"), F.countDistinct("message_id").alias("m")),
        back["orphans"].groupBy(*T.QUEUE_KEY).agg(F.count(F.lit(1)).alias("n")),
        back["gaps"].groupBy(*T.QUEUE_KEY).agg(F.count(F.lit(1)).alias("n"), F.sum("missing").alias("m")),
        distinct_ids.groupBy("cause").agg(F.count(F.lit(1)).alias("n")),
        distinct_ids.withColumn("n", rank).where(F.col("n") <= cfg.attention_limit),
    ]
    tags = ("duplicates", "orphans", "gaps", "total", "first")
    combined = tagged(parts[0], tags[0])
    for part, tag in zip(parts[1:], tags[1:], strict=True):
        combined = combined.unionByName(tagged(part, tag))
    first: list[tuple[str, int, str, str]] = []
    for row in _rows(combined):
        key = {k: row[k] for k in T.QUEUE_KEY}
        n, m = int(row["n"]), int(row["m"] or 0)
        if row["tag"] == "duplicates":
            c.duplicates.append({**key, "cause": row["cause"], "deliveries": n, "messages": m})
        elif row["tag"] == "orphans":
            c.orphans.append({**key, "orphan_logs": n})
        elif row["tag"] == "gaps":
            c.gaps.append({**key, "gaps": n, "missing_offsets": m})
        elif row["tag"] == "total":
            c.attention_totals[row["cause"]] = n
        else:
            first.append((row["cause"], n, row["consumer_group"], row["message_id"]))
    for kind, _, group, message_id in sorted(first):
        c.attention.setdefault(kind, []).append((group, message_id))
    c.duplicate_pairs = c.attention_totals.get("duplicates", 0)


def reconcile(
    spark: SparkSession,
    inputs: io.Inputs,
    out_dir: Path,
    cfg: ReconcileConfig,
    thresholds: Thresholds,
    *,
    source: str,
    progress: Progress | None = None,
    started: float | None = None,
) -> RunResult:
    """Compute everything; write ``summary.json``, the detail tables and ``report.html`` into ``out_dir``."""
    t0 = started if started is not None else time.perf_counter()
    p = progress or Progress(8, enabled=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    persisted: list[DataFrame] = []

    def keep(df: DataFrame) -> DataFrame:
        persisted.append(df.persist(StorageLevel.MEMORY_AND_DISK))
        return df

    def keep_now(df: DataFrame) -> DataFrame:  # small frames read by several stages of one query
        keep(df).count()
        return df

    try:
        p.step("classifying deliveries, joining them with the (group, message) pairs (cached)")
        parts = io.co_partitions(spark)
        logs, stubs, inbox = (io.by_message(df, parts) for df in (inputs.logs, inputs.stubs, inputs.inbox))
        classified = T.classify_deliveries(logs)
        joined = T.join_pairs_deliveries(T.pairs(stubs, inbox), T.delivery_stats(classified))
        enriched = keep(T.enrich_pairs(joined, inputs.progress, cfg))
        enriched.count()  # materialises the cache here, so the stage timings say where the time goes
        pairs = enriched.where(F.col("has_pair"))
        duplicates = T.duplicate_deliveries(enriched)

        p.step("per-queue counts, lag and latency sketch (group and overall rows summed on the driver)")
        c = Collected()
        queue_rows = _rows(A.queue_stats(pairs))
        counts = keep_now(A.sketch_and_timeline_counts(pairs))  # one scan for the sketch and the timeline
        c.pair_stats = rollup.roll_up(queue_rows, _rows(A.sketch_rows(counts)))
        c.never_consumed = rollup.never_consumed(queue_rows)
        c.targeted_resends = rollup.targeted_resends(queue_rows, A.RESEND_CAP)
        c.message_resends = _rows(A.message_resend_histogram(inputs.stubs))
        c.messages = sum(int(r["messages"]) for r in c.message_resends)
        c.progress = _rows(inputs.progress)
        # the window's minutes only: the log is read from before `since` with no upper end (for the pairs'
        # sake), and until 2026-11-28 the timeline counted those earlier and later deliveries as the window's
        received = in_log_window(cfg)
        pair_counts = A.timeline_rows(counts).where(in_minute_window(cfg))
        frame = timeline_frame(inputs.logs.where(received), duplicates.where(received), pair_counts, keep_now)
        c.timeline = _rows(frame)

        p.step("lost, stuck, dead and unsent pairs")
        attention = keep(T.needs_attention(pairs))  # few rows: one pass over the join, four small writes
        for name in ("lost", "stuck", "dead", "unsent"):
            io.write_detail(T.flagged(attention, name), out_dir, name)

        p.step("duplicate deliveries")
        io.write_detail(duplicates, out_dir, "duplicates")

        p.step("orphan logs")
        candidates = orphan_candidates(enriched)
        few = candidates.count() <= ORPHAN_BROADCAST_ROWS
        orphans = orphan_logs(inputs.logs, candidates, inputs.all_stub_ids, cfg, few_candidates=few)
        io.write_detail(orphans, out_dir, "orphans")

        p.step("offset gaps")
        io.write_detail(offset_gaps(inputs.logs, cfg), out_dir, "gaps")
    finally:
        for df in persisted:
            df.unpersist(blocking=True)  # the next job in this JVM gets the memory back before it starts

    p.step("reading back the detail tables")
    back = {name: spark.read.parquet(str(out_dir / f"{name}.parquet")) for name in DETAIL_TABLES}
    _read_back(back, cfg, c)

    p.step("summary.json and report.html")
    elapsed = time.perf_counter() - t0
    summary = build_summary(
        c, cfg, thresholds, source=source, generated_at=dt.datetime.now(dt.UTC), elapsed_s=elapsed
    )
    io.write_json(summary, out_dir / "summary.json")
    (out_dir / "report.html").write_text(render_html(summary), encoding="utf-8")
    line = ", ".join(f"{name} {value}" for name, value in headline(summary))
    p.done(f"{line} ({elapsed:.1f}s) → {out_dir}")
    return RunResult(summary=summary, out_dir=out_dir, elapsed_s=elapsed)
