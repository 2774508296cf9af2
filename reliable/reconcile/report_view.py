"""The report's view-model: everything the page shows, computed from summary.json and nothing else.

Why a separate step: the HTML is a pure function of this model, and this model is the one place that knows
the shape of summary.json. When the summary's schema changes (per-group figures in schema_version 2), only
:func:`report_view` changes; the renderer, its charts and its tests of layout stay as they are.

Today (schema_version 1) the per-group figures are sums over that group's queues; the timeline comes from the
summary's ``timeline`` key when the run produced one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reliable.reconcile.summary import QUEUE_COUNTERS, headline

#: tile keys shown red when positive
BAD_WHEN_POSITIVE = frozenset({"lost", "stuck", "dead", "unsent", "orphan logs", "offset gaps"})

#: attention categories, most urgent first, with what each means and what to do about it
ATTENTION: dict[str, str] = {
    "dead": "resends exhausted, a person was notified: find why the group never confirmed; revive or void",
    "lost": "the consumer moved past the message's offset without receiving it: the sweeper re-sends these",
    "stuck": "delivered but never confirmed for longer than stuck_after: look at the handler's failures",
    "unsent": "the producer's send never returned a result: check the producer's broker connection",
    "orphans": "deliveries of an id with no stub in the window: another producer, or a stub deleted early",
    "duplicates": "suppressed extra deliveries (no harm done): the causes show where they come from",
}

#: the figures of a group's tiles: (tile label, queue counter summed over the group's queues)
GROUP_TILES = (
    ("stubs", "stubs"),
    ("deliveries", "deliveries"),
    ("lost", "lost"),
    ("stuck", "stuck"),
    ("dead", "dead"),
    ("unsent", "unsent"),
    ("duplicate deliveries", "duplicate_deliveries"),
    ("lag", "lag"),
)


@dataclass(frozen=True)
class Tile:
    key: str
    value: int
    bad: bool


@dataclass(frozen=True)
class TimelineView:
    """Per-minute series of one group (or all groups), aligned on ``minutes``."""

    minutes: list[str]
    fresh: list[int]
    duplicates: dict[str, list[int]]
    resends: list[int]
    p95_ms: list[float | None]
    backlog: list[int]


@dataclass(frozen=True)
class GroupView:
    name: str
    tiles: list[Tile]
    queues: list[Mapping[str, Any]]
    duplicates_by_cause: dict[str, int]
    timeline: TimelineView | None


@dataclass(frozen=True)
class AttentionView:
    cause: str
    meaning: str
    total: int
    first_ids: list[str]
    breakdown: dict[str, int] = field(default_factory=dict)

    @property
    def more(self) -> int:
        return max(0, self.total - len(self.first_ids))


@dataclass(frozen=True)
class ReportView:
    meta: str
    ok: bool
    status: str
    tiles: list[Tile]
    timeline: TimelineView | None
    groups: list[GroupView]
    queues: list[Mapping[str, Any]]
    latency_ms: Mapping[str, Mapping[str, Any]]
    latency_histogram: Mapping[str, Any]
    resend_histogram: list[Mapping[str, Any]]
    duplicates_by_cause: dict[str, int]
    attention: list[AttentionView]
    schema_version: int


def _tiles(pairs: Sequence[tuple[str, int]]) -> list[Tile]:
    return [Tile(k, int(v), k in BAD_WHEN_POSITIVE and bool(v)) for k, v in pairs]


def timeline_view(points: Sequence[Mapping[str, Any]]) -> TimelineView | None:
    """The series of one timeline (``None`` when the run produced none)."""
    if not points:
        return None
    causes = list(points[0]["duplicates"])
    dups = {c: [int(p["duplicates"][c]) for p in points] for c in causes}
    total_dups = [sum(d[i] for d in dups.values()) for i in range(len(points))]
    return TimelineView(
        minutes=[str(p["minute"]) for p in points],
        fresh=[int(p["deliveries"]) - total_dups[i] for i, p in enumerate(points)],
        duplicates=dups,
        resends=[int(p["resends"]) for p in points],
        p95_ms=[None if p["p95_ms"] is None else float(p["p95_ms"]) for p in points],
        backlog=[int(p["backlog"]) for p in points],
    )


def _group_views(summary: Mapping[str, Any]) -> list[GroupView]:
    by_group: dict[str, list[Mapping[str, Any]]] = {}
    for q in summary["queues"]:
        by_group.setdefault(str(q["consumer_group"]), []).append(q)
    timelines = (summary.get("timeline") or {}).get("groups", {})
    out = []
    for name in sorted(by_group):
        queues = by_group[name]
        sums = {c: sum(int(q[c]) for q in queues) for c in (*QUEUE_COUNTERS, "lag")}
        causes: dict[str, int] = {}
        for q in queues:
            for cause, n in q["duplicates_by_cause"].items():
                causes[cause] = causes.get(cause, 0) + int(n)
        out.append(
            GroupView(
                name=name,
                tiles=_tiles([(label, sums[key]) for label, key in GROUP_TILES]),
                queues=queues,
                duplicates_by_cause=causes,
                timeline=timeline_view(timelines.get(name, [])),
            )
        )
    return out


def _attention(summary: Mapping[str, Any]) -> list[AttentionView]:
    entries = summary["attention"]
    out = []
    for cause, meaning in ATTENTION.items():
        entry = entries.get(cause) or {"total": 0, "message_ids": []}
        breakdown = dict(summary["duplicates_by_cause"]) if cause == "duplicates" else {}
        out.append(AttentionView(cause, meaning, int(entry["total"]), list(entry["message_ids"]), breakdown))
    return sorted(out, key=lambda a: a.total == 0)  # the ones with something in them first, order kept


def _meta(summary: Mapping[str, Any]) -> str:
    window = summary["window"]
    return (
        f"source {summary['source']} · as of {summary['as_of']} · "
        f"window {window['since'] or '−∞'} … {window['until'] or '+∞'} · generated {summary['generated_at']}"
    )


def report_view(summary: Mapping[str, Any]) -> ReportView:
    """Everything the page shows (plain text: the renderer escapes)."""
    ok = bool(summary["ok"])
    status = (
        "OK: no threshold crossed"
        if ok
        else "ALERT: "
        + ", ".join(f"{b['threshold']} {b['value']} > {b['limit']}" for b in summary["breaches"])
    )
    return ReportView(
        meta=_meta(summary),
        ok=ok,
        status=status,
        tiles=_tiles(headline(summary)),
        timeline=timeline_view((summary.get("timeline") or {}).get("all", [])),
        groups=_group_views(summary),
        queues=list(summary["queues"]),
        latency_ms=summary["latency_ms"],
        latency_histogram=summary["latency_histogram"],
        resend_histogram=list(summary["resend_histogram"]),
        duplicates_by_cause=dict(summary["duplicates_by_cause"]),
        attention=_attention(summary),
        schema_version=int(summary["schema_version"]),
    )
