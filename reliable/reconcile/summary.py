"""``summary.json``: the stable, documented result of one reconciliation run (schema in docs/reconcile.md).

Built from small lists of plain dicts the driver collected (one per queue, per cause, per bucket), so this
module needs no Spark and is easy to test. Keys are only ever added; removing or re-defining one bumps
:data:`reliable.reconcile.config.SCHEMA_VERSION`. Every count is an ``int`` (never null), every queue
appears once, sorted by (consumer_group, topic, queue_id) with the null queue_id (unsent) first.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reliable.reconcile.config import SCHEMA_VERSION, DuplicateCause, ReconcileConfig, Thresholds
from reliable.reconcile.timeline import timeline_summary
from reliable.reconcile.transforms import LATENCY_LABELS, PERCENTILES, RESEND_CAP, STATUSES

Row = Mapping[str, Any]
QueueKey = tuple[str, str, int | None]

#: per-queue counters, in the order the summary and the HTML table show them
QUEUE_COUNTERS = (
    "stubs",
    "pending",
    "confirmed",
    "voided",
    "dead",
    "lost",
    "stuck",
    "unsent",
    "deliveries",
    "duplicate_deliveries",
    "orphan_logs",
    "gaps",
    "missing_offsets",
)
LATENCY_METRICS = ("first_delivery_ms", "confirm_ms")
LATENCY_NAMES = {"first_delivery_ms": "send_to_first_delivery", "confirm_ms": "send_to_confirm"}


@dataclass
class Collected:
    """What the driver brought back from Spark; every list holds plain dicts keyed like the DataFrames."""

    queue_stats: list[Row] = field(default_factory=list)  # transforms.queue_stub_stats
    resend: list[Row] = field(default_factory=list)  # send_count, stubs
    duplicates: list[Row] = field(default_factory=list)  # queue key, cause, deliveries, messages
    duplicate_messages: int = 0
    orphans: list[Row] = field(default_factory=list)  # queue key, orphan_logs
    gaps: list[Row] = field(default_factory=list)  # queue key, gaps, missing_offsets
    progress: list[Row] = field(default_factory=list)  # queue key, max_offset
    attention: dict[str, list[str]] = field(default_factory=dict)
    attention_totals: dict[str, int] = field(default_factory=dict)
    timeline: list[Row] = field(default_factory=list)  # timeline.timeline_frame


def _key(row: Row) -> QueueKey:
    qid = row.get("queue_id")
    return (str(row["consumer_group"]), str(row["topic"]), None if qid is None else int(qid))


def _sort_key(k: QueueKey) -> tuple[str, str, int]:
    return (k[0], k[1], -1 if k[2] is None else k[2])


def _num(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _latency(row: Row | None, metric: str) -> dict[str, Any]:
    row = row or {}
    out: dict[str, Any] = {"count": int(row.get(f"{metric}_count") or 0)}
    for p in PERCENTILES:
        name = f"p{round(p * 100)}"
        out[name] = _num(row.get(f"{metric}_{name}"))
    out["max"] = _num(row.get(f"{metric}_max"))
    return out


def _lag(max_stub_offset: int | None, watermark: int | None) -> int:
    """Offsets the consumer has not reached: max stub offset − watermark (−1 when nothing consumed), ≥ 0."""
    if max_stub_offset is None:
        return 0
    return max(0, int(max_stub_offset) - (-1 if watermark is None else int(watermark)))


def _add(table: dict[QueueKey, dict[str, Any]], rows: Iterable[Row], mapping: Mapping[str, str]) -> None:
    for row in rows:
        q = _queue(table, _key(row))
        for src, dst in mapping.items():
            q[dst] += int(row.get(src) or 0)


def _queue(table: dict[QueueKey, dict[str, Any]], key: QueueKey) -> dict[str, Any]:
    if key not in table:
        table[key] = {
            "consumer_group": key[0],
            "topic": key[1],
            "queue_id": key[2],
            **dict.fromkeys(QUEUE_COUNTERS, 0),
            "duplicates_by_cause": {c.value: 0 for c in DuplicateCause},
            "max_stub_offset": None,
            "watermark": None,
            "lag": 0,
            "latency_ms": {LATENCY_NAMES[m]: _latency(None, m) for m in LATENCY_METRICS},
        }
    return table[key]


def build_summary(
    collected: Collected,
    cfg: ReconcileConfig,
    thresholds: Thresholds,
    *,
    source: str,
    generated_at: dt.datetime | None = None,
    elapsed_s: float | None = None,
) -> dict[str, Any]:
    """The summary dictionary (schema_version :data:`SCHEMA_VERSION`), with ``breaches`` evaluated."""
    queues: dict[QueueKey, dict[str, Any]] = {}
    total_row: Row | None = None
    for row in collected.queue_stats:
        if row.get("is_total"):
            total_row = row
            continue
        q = _queue(queues, _key(row))
        for name in ("stubs", "deliveries", *(s.lower() for s in STATUSES), "lost", "stuck", "unsent"):
            q[name] = int(row.get(name) or 0)
        q["max_stub_offset"] = None if row.get("max_stub_offset") is None else int(row["max_stub_offset"])
        q["latency_ms"] = {LATENCY_NAMES[m]: _latency(row, m) for m in LATENCY_METRICS}
    for row in collected.progress:
        _queue(queues, _key(row))["watermark"] = int(row["max_offset"])
    _add(queues, collected.orphans, {"orphan_logs": "orphan_logs"})
    _add(queues, collected.gaps, {"gaps": "gaps", "missing_offsets": "missing_offsets"})
    by_cause = {c.value: 0 for c in DuplicateCause}
    for row in collected.duplicates:
        q = _queue(queues, _key(row))
        n = int(row.get("deliveries") or 0)
        q["duplicate_deliveries"] += n
        q["duplicates_by_cause"][str(row["cause"])] += n
        by_cause[str(row["cause"])] += n
    for q in queues.values():
        q["lag"] = _lag(q["max_stub_offset"], q["watermark"])

    ordered = [queues[k] for k in sorted(queues, key=_sort_key)]
    totals: dict[str, int] = {name: sum(int(q[name]) for q in ordered) for name in QUEUE_COUNTERS}
    totals["duplicate_messages"] = int(collected.duplicate_messages)
    totals["lag"] = sum(int(q["lag"]) for q in ordered)
    latency = {LATENCY_NAMES[m]: _latency(total_row, m) for m in LATENCY_METRICS}
    histogram = {
        "buckets": list(LATENCY_LABELS),
        **{
            LATENCY_NAMES[m]: [
                int((total_row or {}).get(f"{m}_hist_{label}") or 0) for label in LATENCY_LABELS
            ]
            for m in LATENCY_METRICS
        },
    }
    resend = {int(r["send_count"]): int(r["stubs"]) for r in collected.resend}
    resend_hist = [
        {"send_count": k, "label": f"{k}+" if k == RESEND_CAP else str(k), "stubs": resend[k]}
        for k in sorted(resend)
    ]
    counts_for_threshold = {
        "max_lost": totals["lost"],
        "max_stuck": totals["stuck"],
        "max_dead": totals["dead"],
        "max_unsent": totals["unsent"],
        "max_duplicates": totals["duplicate_deliveries"],
        "max_orphans": totals["orphan_logs"],
        "max_gaps": totals["gaps"],
        "max_lag": totals["lag"],
    }
    breaches = evaluate_thresholds(counts_for_threshold, thresholds)
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": _iso(generated_at or dt.datetime.now(dt.UTC)),
        "source": source,
        "as_of": _iso(cfg.as_of),
        "window": {"since": _iso(cfg.since), "until": _iso(cfg.until)},
        "settings": {
            "grace_s": cfg.grace_s,
            "stuck_after_s": cfg.stuck_after_s,
            "attention_limit": cfg.attention_limit,
        },
        "elapsed_s": None if elapsed_s is None else round(elapsed_s, 3),
        "totals": totals,
        "duplicates_by_cause": by_cause,
        "latency_ms": latency,
        "latency_histogram": histogram,
        "resend_histogram": resend_hist,
        "queues": ordered,
        "attention": {
            name: {
                "total": int(collected.attention_totals.get(name, 0)),
                "message_ids": list(collected.attention.get(name, [])),
            }
            for name in ("lost", "stuck", "dead", "unsent", "duplicates", "orphans")
        },
        "timeline": timeline_summary(collected.timeline),
        "thresholds": thresholds.as_dict(),
        "breaches": breaches,
        "ok": not breaches,
    }


def evaluate_thresholds(counts: Mapping[str, int], thresholds: Thresholds) -> list[dict[str, Any]]:
    """One entry per crossed threshold: ``{"threshold", "limit", "value"}`` (empty list = all fine)."""
    out: list[dict[str, Any]] = []
    for name, limit in thresholds.as_dict().items():
        if limit is not None and counts.get(name, 0) > limit:
            out.append({"threshold": name, "limit": limit, "value": int(counts[name])})
    return out


def headline(summary: Mapping[str, Any]) -> Sequence[tuple[str, int]]:
    """The numbers a person looks at first (the console line and the HTML tiles show these)."""
    t = summary["totals"]
    return (
        ("stubs", t["stubs"]),
        ("deliveries", t["deliveries"]),
        ("lost", t["lost"]),
        ("stuck", t["stuck"]),
        ("dead", t["dead"]),
        ("unsent", t["unsent"]),
        ("duplicate deliveries", t["duplicate_deliveries"]),
        ("orphan logs", t["orphan_logs"]),
        ("offset gaps", t["gaps"]),
        ("lag", t["lag"]),
    )
