"""``summary.json``: the stable, documented result of one reconciliation run (schema in docs/reconcile.md).

Built from small lists of plain dicts the driver collected (one per queue, per group, per cause, per
bucket), so this module needs no Spark and is easy to test. Keys are only ever added; removing or
re-defining one bumps :data:`reliable.reconcile.config.SCHEMA_VERSION`. Every count is an ``int`` (never
null); queues are sorted by (consumer_group, topic, broker_name, queue_id) with the null queue_id (unsent)
first, groups by name. Figures are per consumer group first: a message several groups consume is one
*message* and one *inbox row* (pair) per group.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reliable.constants import AMQP_CLOCK_POSITION_MIN
from reliable.reconcile.aggregates import LATENCY_LABELS, RESEND_CAP
from reliable.reconcile.config import SCHEMA_VERSION, DuplicateCause, ReconcileConfig, Thresholds
from reliable.reconcile.rollup import LATENCY_METRICS, LEVEL_GROUP, LEVEL_TOTAL, PERCENTILES
from reliable.reconcile.timeline import timeline_summary
from reliable.reconcile.transforms import STATUSES

Row = Mapping[str, Any]
#: (consumer_group, topic, broker_name, queue_id)
QueueKey = tuple[str, str, str, int | None]

#: counters of a queue and of a group, in the order the summary and the HTML tables show them
COUNTERS = (
    "inbox_rows",
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
LATENCY_NAMES = {"first_delivery_ms": "send_to_first_delivery", "confirm_ms": "send_to_confirm"}
#: the lists of (group, message id) pairs that need a person
ATTENTION_KINDS = ("lost", "stuck", "dead", "unsent", "duplicates", "orphans")


@dataclass
class Collected:
    """What the driver brought back from Spark; every list holds plain dicts keyed like the DataFrames."""

    pair_stats: list[Row] = field(default_factory=list)  # rollup.roll_up (level queue/group/total)
    messages: int = 0
    message_resends: list[Row] = field(default_factory=list)  # send_count, messages
    targeted_resends: list[Row] = field(default_factory=list)  # consumer_group, resend_count, inbox_rows
    duplicates: list[Row] = field(default_factory=list)  # queue key, cause, deliveries, messages
    duplicate_pairs: int = 0
    orphans: list[Row] = field(default_factory=list)  # queue key, orphan_logs
    gaps: list[Row] = field(default_factory=list)  # queue key, gaps, missing_offsets
    progress: list[Row] = field(default_factory=list)  # queue key, max_offset
    never_consumed: list[Row] = field(default_factory=list)  # queue key, inbox_rows, pending, max_stub_offset
    attention: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # kind → (group, message_id)
    attention_totals: dict[str, int] = field(default_factory=dict)
    timeline: list[Row] = field(default_factory=list)  # timeline.timeline_frame


def _key(row: Row) -> QueueKey:
    qid = row.get("queue_id")
    broker = str(row.get("broker_name") or "")
    return (str(row["consumer_group"]), str(row["topic"]), broker, None if qid is None else int(qid))


def _sort_key(k: QueueKey) -> tuple[str, str, str, int]:
    return (k[0], k[1], k[2], -1 if k[3] is None else k[3])


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


def _latencies(row: Row | None) -> dict[str, Any]:
    return {LATENCY_NAMES[m]: _latency(row, m) for m in LATENCY_METRICS}


def _lag(max_stub_offset: int | None, watermark: int | None) -> int:
    """Offsets the group has not reached: max stub offset − watermark (−1 when nothing consumed), ≥ 0."""
    if max_stub_offset is None:
        return 0
    return max(0, int(max_stub_offset) - (-1 if watermark is None else int(watermark)))


def has_offsets(max_stub_offset: int | None, watermark: int | None) -> bool:
    """Whether a queue's positions are offsets: not a RabbitMQ queue, whose positions are its senders' clock
    (``AMQP_CLOCK_POSITION_MIN`` and above) — the distance between two is time, not messages, so the queue
    has no lag and no offset gaps (a RabbitMQ topic's lag was about its age in microseconds)."""
    return all(p is None or int(p) < AMQP_CLOCK_POSITION_MIN for p in (max_stub_offset, watermark))


def _causes() -> dict[str, int]:
    return {c.value: 0 for c in DuplicateCause}


def _queue(table: dict[QueueKey, dict[str, Any]], key: QueueKey) -> dict[str, Any]:
    if key not in table:
        table[key] = {
            "consumer_group": key[0],
            "topic": key[1],
            "broker_name": key[2],
            "queue_id": key[3],
            **dict.fromkeys(COUNTERS, 0),
            "duplicates_by_cause": _causes(),
            "max_stub_offset": None,
            "watermark": None,
            "lag": 0,
            "offsets": True,
            "never_consumed": False,
            "latency_ms": _latencies(None),
        }
    return table[key]


def _add(table: dict[QueueKey, dict[str, Any]], rows: Iterable[Row], mapping: Mapping[str, str]) -> None:
    for row in rows:
        q = _queue(table, _key(row))
        for src, dst in mapping.items():
            q[dst] += int(row.get(src) or 0)


def _queues(c: Collected) -> list[dict[str, Any]]:
    queues: dict[QueueKey, dict[str, Any]] = {}
    for row in c.pair_stats:
        if row.get("level") not in (None, "queue"):
            continue
        q = _queue(queues, _key(row))
        for name in ("inbox_rows", "deliveries", *(s.lower() for s in STATUSES), "lost", "stuck", "unsent"):
            q[name] = int(row.get(name) or 0)
        q["max_stub_offset"] = None if row.get("max_stub_offset") is None else int(row["max_stub_offset"])
        q["latency_ms"] = _latencies(row)
    for row in c.progress:
        _queue(queues, _key(row))["watermark"] = int(row["max_offset"])
    for row in c.never_consumed:
        _queue(queues, _key(row))["never_consumed"] = True
    _add(queues, c.orphans, {"orphan_logs": "orphan_logs"})
    _add(queues, c.gaps, {"gaps": "gaps", "missing_offsets": "missing_offsets"})
    for row in c.duplicates:
        q = _queue(queues, _key(row))
        n = int(row.get("deliveries") or 0)
        q["duplicate_deliveries"] += n
        q["duplicates_by_cause"][str(row["cause"])] += n
    unnamed = {
        (k[0], k[1], k[3]): q["watermark"]
        for k, q in queues.items()
        if k[2] == "" and q["watermark"] is not None
    }
    for (group, topic, broker, queue_id), q in queues.items():
        watermark = q["watermark"]
        if watermark is None and broker:  # a client that cannot name the broker group keeps its position here
            watermark = unnamed.get((group, topic, queue_id))
        owed = q["inbox_rows"] > q["voided"]  # a queue of voided pairs only (a retired group) owes nothing
        q["offsets"] = has_offsets(q["max_stub_offset"], watermark)
        q["lag"] = _lag(q["max_stub_offset"], watermark) if owed and q["offsets"] else 0
    return [queues[k] for k in sorted(queues, key=_sort_key)]


def _resend_hist(counts: Mapping[int, int], key: str, unit: str) -> list[dict[str, Any]]:
    return [
        {key: k, "label": f"{k}+" if k == RESEND_CAP else str(k), unit: counts[k]} for k in sorted(counts)
    ]


def _never_consumed_entry(row: Row) -> dict[str, Any]:
    k = _key(row)
    return {
        "consumer_group": k[0],
        "topic": k[1],
        "broker_name": k[2],
        "queue_id": k[3],
        "inbox_rows": int(row.get("inbox_rows") or 0),
        "pending": int(row.get("pending") or 0),
        "max_stub_offset": None if row.get("max_stub_offset") is None else int(row["max_stub_offset"]),
    }


def _groups(c: Collected, queues: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per consumer group: its queues summed, its own percentiles, its never-consumed queues."""
    stats = {str(r["consumer_group"]): r for r in c.pair_stats if r.get("level") == LEVEL_GROUP}
    names = sorted({str(q["consumer_group"]) for q in queues} | set(stats))
    out = []
    for name in names:
        mine = [q for q in queues if q["consumer_group"] == name]
        by_cause = _causes()
        for q in mine:
            for cause, n in q["duplicates_by_cause"].items():
                by_cause[cause] += n
        resends = {
            int(r["resend_count"]): int(r["inbox_rows"])
            for r in c.targeted_resends
            if str(r["consumer_group"]) == name
        }
        never = [_never_consumed_entry(r) for r in c.never_consumed if str(r["consumer_group"]) == name]
        out.append(
            {
                "consumer_group": name,
                **{k: sum(int(q[k]) for q in mine) for k in COUNTERS},
                "lag": sum(int(q["lag"]) for q in mine),
                "never_consumed_queues": len(never),
                "duplicates_by_cause": by_cause,
                "latency_ms": _latencies(stats.get(name)),
                "targeted_resend_histogram": _resend_hist(resends, "resend_count", "inbox_rows"),
            }
        )
    return out


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
    c = collected
    queues = _queues(c)
    total_row = next((r for r in c.pair_stats if r.get("level") == LEVEL_TOTAL), None)
    never = sorted((_never_consumed_entry(r) for r in c.never_consumed), key=lambda e: _sort_key(_key(e)))
    totals: dict[str, int] = {"messages": int(c.messages)}
    totals.update({name: sum(int(q[name]) for q in queues) for name in COUNTERS})
    totals["duplicate_pairs"] = int(c.duplicate_pairs)
    totals["lag"] = sum(int(q["lag"]) for q in queues)
    totals["never_consumed_queues"] = len(never)
    by_cause = _causes()
    for q in queues:
        for cause, n in q["duplicates_by_cause"].items():
            by_cause[cause] += n
    histogram = {
        "buckets": list(LATENCY_LABELS),
        **{
            LATENCY_NAMES[m]: [
                int((total_row or {}).get(f"{m}_hist_{label}") or 0) for label in LATENCY_LABELS
            ]
            for m in LATENCY_METRICS
        },
    }
    message_resends = {int(r["send_count"]): int(r["messages"]) for r in c.message_resends}
    counts_for_threshold = {
        "max_lost": totals["lost"],
        "max_stuck": totals["stuck"],
        "max_dead": totals["dead"],
        "max_unsent": totals["unsent"],
        "max_duplicates": totals["duplicate_deliveries"],
        "max_orphans": totals["orphan_logs"],
        "max_gaps": totals["gaps"],
        "max_lag": totals["lag"],
        "max_never_consumed": totals["never_consumed_queues"],
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
            # offset gaps are looked for among deliveries received since then (None: the whole log)
            "gaps_since": _iso(cfg.complete_log_since),
        },
        "elapsed_s": None if elapsed_s is None else round(elapsed_s, 3),
        "totals": totals,
        "duplicates_by_cause": by_cause,
        "latency_ms": _latencies(total_row),
        "latency_histogram": histogram,
        "resend_histogram": _resend_hist(message_resends, "send_count", "messages"),
        "groups": _groups(c, queues),
        "never_consumed": never,
        "queues": queues,
        "attention": {
            name: {
                "total": int(c.attention_totals.get(name, 0)),
                "pairs": [{"consumer_group": g, "message_id": m} for g, m in c.attention.get(name, [])],
            }
            for name in ATTENTION_KINDS
        },
        "timeline": timeline_summary(c.timeline),
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
        ("messages", t["messages"]),
        ("inbox rows", t["inbox_rows"]),
        ("deliveries", t["deliveries"]),
        ("lost", t["lost"]),
        ("stuck", t["stuck"]),
        ("dead", t["dead"]),
        ("unsent", t["unsent"]),
        ("never consumed", t["never_consumed_queues"]),
        ("duplicate deliveries", t["duplicate_deliveries"]),
        ("orphan logs", t["orphan_logs"]),
        ("offset gaps", t["gaps"]),
        ("lag", t["lag"]),
    )
