"""A summary built without Spark for the page tests: two groups, long names, a 30-minute timeline.

The rows have the shapes the Spark job collects (reliable.reconcile.summary.Collected and
reliable.reconcile.timeline.timeline_frame), so ``build_summary`` produces a real summary.json from them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from reliable.reconcile.config import DuplicateCause, ReconcileConfig, Thresholds
from reliable.reconcile.summary import Collected, build_summary
from reliable.reconcile.timeline import ALL_GROUPS, CAUSES

T0 = dt.datetime(2026, 11, 23, 14, 0)
GROUPS = ("o_ledger_settlement_consumers", "audit")
TOPICS = ("DemoOrders", "DemoOrdersWithAVeryLongTopicNameFromTheBillingTeam")


def _queue(group: str, topic: str, qid: int, n: int) -> dict[str, Any]:
    return {
        "consumer_group": group,
        "topic": topic,
        "queue_id": qid,
        "is_total": False,
        "stubs": 100 + n,
        "deliveries": 120 + n,
        "pending": 3 + n,
        "confirmed": 95,
        "voided": 1,
        "dead": n % 2,
        "lost": n % 3,
        "stuck": 1,
        "unsent": 0,
        "max_stub_offset": 1000 + 10 * n,
        "first_delivery_ms_count": 99,
        "first_delivery_ms_p50": 12.5 + n,
        "first_delivery_ms_p99": 480.0,
    }


def _minute_rows(group: str, scale: int) -> list[dict[str, Any]]:
    rows = []
    for m in range(30):
        if m in (7, 8):  # two quiet minutes: the series must still be continuous
            continue
        burst = 12 if 15 <= m <= 17 else 0  # a fault: duplicates and resends, backlog builds up
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


def collected() -> Collected:
    c = Collected()
    n = 0
    for group in GROUPS:
        for topic in TOPICS:
            for qid in range(2):
                c.queue_stats.append(_queue(group, topic, qid, n))
                key = {"consumer_group": group, "topic": topic, "queue_id": qid}
                c.progress.append({**key, "max_offset": 990})
                c.duplicates.append(
                    {
                        "consumer_group": group,
                        "topic": topic,
                        "queue_id": qid,
                        "cause": DuplicateCause.RETRY.value if n % 2 else DuplicateCause.REDELIVERY.value,
                        "deliveries": 2 + n,
                    }
                )
                n += 1
    c.queue_stats.append({"is_total": True, "consumer_group": None, "topic": None, "queue_id": None})
    c.resend = [{"send_count": k, "stubs": n} for k, n in ((1, 700), (2, 30), (10, 2))]
    c.attention = {
        "lost": [f"LOST-{i}" for i in range(5)],
        "dead": ["DEAD-order-with-a-rather-long-business-identifier-0001"],
        "duplicates": [f"DUP-{i}" for i in range(10)],
    }
    c.attention_totals = {"lost": 42, "dead": 1, "duplicates": 37}
    c.timeline = _minute_rows(ALL_GROUPS, 2) + [r for g in GROUPS for r in _minute_rows(g, 1)]
    return c


def summary() -> dict[str, Any]:
    return build_summary(
        collected(),
        ReconcileConfig(),
        Thresholds(max_lost=0),
        source="postgresql://reconcile@db/prod",
        generated_at=T0 + dt.timedelta(hours=1),
    )


def summary_v2() -> dict[str, Any]:
    """The same run in the per-group shape of summary.json schema_version 2 (issue #11): inbox rows per
    group, a ``groups`` list with each group's own figures, never-consumed queues, attention as pairs."""
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
    s["totals"] |= {
        "messages": 500,
        "inbox_rows": sum(g["inbox_rows"] for g in groups),
        "never_consumed_queues": 1,
    }
    for entry in s["attention"].values():
        entry["pairs"] = [{"consumer_group": "audit", "message_id": m} for m in entry.pop("message_ids")]
    for r in s["resend_histogram"]:
        r["messages"] = r.pop("stubs")
    s["schema_version"] = 2
    return s
