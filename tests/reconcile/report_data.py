"""summary.json documents for the page tests, written out by hand: two groups, long names, a timeline.

Why by hand and not through ``build_summary``: the page is a function of summary.json alone, and the page
tests must not depend on how the Spark driver's intermediate rows look (they change with the schema). The
documents follow docs/reconcile.md; the timeline goes through the real
:func:`reliable.reconcile.timeline.timeline_summary` from per-minute rows of the Spark job's shape.

:func:`summary` is schema_version 1 (one stub per message and group), :func:`summary_v2` the per-group
shape of schema_version 2. Both carry the ``totals`` keys of either version's headline.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from reliable.reconcile.timeline import ALL_GROUPS, CAUSES, timeline_summary

T0 = dt.datetime(2026, 11, 23, 14, 0, tzinfo=dt.UTC)
GROUPS = ("o_ledger_settlement_consumers", "audit")
TOPICS = ("DemoOrders", "DemoOrdersWithAVeryLongTopicNameFromTheBillingTeam")
COUNTERS: tuple[str, ...] = ("stubs", "pending", "confirmed", "voided", "dead", "lost", "stuck", "unsent")
COUNTERS += ("deliveries", "duplicate_deliveries", "orphan_logs", "gaps", "missing_offsets", "lag")


def _latency(p50: float | None = None) -> dict[str, Any]:
    return {"count": 0 if p50 is None else 99, "p50": p50, "p95": None, "p99": None, "max": None}


def _queue(group: str, topic: str, qid: int, n: int) -> dict[str, Any]:
    dup = 2 + n
    return {
        "consumer_group": group,
        "topic": topic,
        "queue_id": qid,
        "stubs": 100 + n,
        "pending": 3 + n,
        "confirmed": 95,
        "voided": 1,
        "dead": n % 2,
        "lost": n % 3,
        "stuck": 1,
        "unsent": 0,
        "deliveries": 120 + n,
        "duplicate_deliveries": dup,
        "orphan_logs": 0,
        "gaps": 0,
        "missing_offsets": 0,
        "duplicates_by_cause": {c: (dup if c == ("retry" if n % 2 else "redelivery") else 0) for c in CAUSES},
        "max_stub_offset": 1000 + 10 * n,
        "watermark": 990,
        "lag": 10 + 10 * n,
        "latency_ms": {"send_to_first_delivery": _latency(12.5 + n), "send_to_confirm": _latency()},
    }


def _minute_rows(group: str, scale: int) -> list[dict[str, Any]]:
    rows = []
    for m in range(30):
        if m in (7, 8):  # two quiet minutes: the series must still be continuous
            continue
        burst = 12 if 15 <= m <= 17 else 0  # a fault: duplicates and resends, the backlog builds up
        rows.append(
            {
                "consumer_group": group,
                "minute": T0 + dt.timedelta(minutes=m),
                "deliveries": (20 + m % 5 + burst) * scale,
                **{f"dup_{c}": (burst // (i + 1)) * scale for i, c in enumerate(CAUSES)},
                "resends": (3 if burst else 0) * scale,
                "staged": 22 * scale,
                "first_delivered": (20 if burst == 0 else 10) * scale,
                "p95_ms": 40.0 + m + 10 * burst,
            }
        )
    return rows


def summary() -> dict[str, Any]:
    """A schema_version 1 summary.json: 2 groups × 2 topics × 2 queues, 30 minutes, one breach."""
    queues = [
        _queue(g, t, qid, n)
        for n, (g, t, qid) in enumerate(
            (g, t, qid) for g in sorted(GROUPS) for t in TOPICS for qid in range(2)
        )
    ]
    totals = {k: sum(q[k] for q in queues) for k in COUNTERS}
    totals |= {
        "duplicate_messages": 30,
        "messages": 500,
        "inbox_rows": totals["stubs"],
        "never_consumed_queues": 0,
    }
    by_cause = {c: sum(q["duplicates_by_cause"][c] for q in queues) for c in CAUSES}
    attention = {
        "lost": (42, [f"LOST-{i}" for i in range(5)]),
        "stuck": (0, []),
        "dead": (1, ["DEAD-order-with-a-rather-long-business-identifier-0001"]),
        "unsent": (0, []),
        "duplicates": (37, [f"DUP-{i}" for i in range(10)]),
        "orphans": (0, []),
    }
    minutes = _minute_rows(ALL_GROUPS, 2) + [r for g in GROUPS for r in _minute_rows(g, 1)]
    return {
        "schema_version": 1,
        "generated_at": "2026-11-23T15:00:00Z",
        "source": "postgresql://reconcile@db/prod",
        "as_of": "2026-11-23T15:00:00Z",
        "window": {"since": None, "until": None},
        "settings": {"grace_s": 300, "stuck_after_s": 900, "attention_limit": 100},
        "elapsed_s": 12.5,
        "totals": totals,
        "duplicates_by_cause": by_cause,
        "latency_ms": {"send_to_first_delivery": _latency(14.0), "send_to_confirm": _latency(30.0)},
        "latency_histogram": {
            "buckets": ["<10ms", "<100ms", "<1s", "<10s", "<1m", "<10m", "<1h", ">=1h"],
            "send_to_first_delivery": [10, 600, 90, 1, 0, 0, 0, 0],
            "send_to_confirm": [0, 500, 190, 11, 0, 0, 0, 0],
        },
        "resend_histogram": [
            {"send_count": k, "label": f"{k}+" if k == 10 else str(k), "stubs": n}
            for k, n in ((1, 700), (2, 30), (10, 2))
        ],
        "queues": queues,
        "attention": {k: {"total": total, "message_ids": ids} for k, (total, ids) in attention.items()},
        "timeline": timeline_summary(minutes),
        "thresholds": {"max_lost": 0},
        "breaches": [{"threshold": "max_lost", "limit": 0, "value": totals["lost"]}],
        "ok": False,
    }


def summary_v2() -> dict[str, Any]:
    """The same run in the per-group shape of schema_version 2 (issue #11): inbox rows per group, a
    ``groups`` list with each group's own figures, never-consumed queues, attention as pairs."""
    s = summary()
    never = {"consumer_group": "audit", "topic": TOPICS[0], "queue_id": 7, "inbox_rows": 4, "pending": 4}
    for q in s["queues"]:
        q["inbox_rows"] = q.pop("stubs")
        q["never_consumed"] = False
    groups = []
    for name in sorted(GROUPS):
        mine = [q for q in s["queues"] if q["consumer_group"] == name]
        g: dict[str, Any] = {"consumer_group": name}
        for key in (
            "inbox_rows",
            "deliveries",
            "lost",
            "stuck",
            "dead",
            "unsent",
            "duplicate_deliveries",
            "lag",
        ):
            g[key] = sum(q[key] for q in mine) + (3 if key == "inbox_rows" else 0)  # a group's own figure
        g["never_consumed_queues"] = 1 if name == "audit" else 0
        groups.append(g)
    s["groups"] = groups
    s["never_consumed"] = [never]
    s["totals"] |= {"inbox_rows": sum(g["inbox_rows"] for g in groups), "never_consumed_queues": 1}
    for entry in s["attention"].values():
        entry["pairs"] = [{"consumer_group": "audit", "message_id": m} for m in entry.pop("message_ids")]
    for r in s["resend_histogram"]:
        r["messages"] = r.pop("stubs")
    s["schema_version"] = 2
    return s
