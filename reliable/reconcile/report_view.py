"""The report's view-model: everything the page shows, computed from summary.json and nothing else.

Why a separate step: the HTML is a pure function of this model, and this model is the one place that knows
the shape of summary.json. When the summary's schema changes (per-group figures in schema_version 2), only
:func:`report_view` changes; the renderer, its charts and its tests of layout stay as they are.

Both shapes are read: schema_version 1 (one stub per message and group; per-group figures are sums over the
group's queues; attention lists ``message_ids``) and schema_version 2 and 3 (per-group inbox rows: a
``groups`` list with each group's own figures, ``never_consumed`` queues, attention ``pairs`` of group and
message id; 3: queues also carry ``broker_name``).
The timeline comes from the summary's ``timeline`` key when the run produced one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reliable.reconcile.summary import headline

#: tile keys shown red when positive
BAD_WHEN_POSITIVE = frozenset(
    {"lost", "stuck", "dead", "unsent", "never consumed", "orphan logs", "offset gaps"}
)

#: attention categories, most urgent first, with what each means and what to do about it
ATTENTION: dict[str, str] = {
    "dead": "resends exhausted, a person was notified: find why the group never confirmed; revive or void",
    "lost": "the consumer moved past the message's offset without receiving it: the sweeper re-sends these",
    "stuck": "delivered but never confirmed for longer than stuck_after: look at the handler's failures",
    "unsent": "the producer's send never returned a result: check the producer's broker connection",
    "orphans": "deliveries of an id with no stub in the window: another producer, or a stub deleted early",
    "duplicates": "suppressed extra deliveries (no harm done): the causes show where they come from",
}

#: schema_version 1 has no per-group figures: these queue counters are summed over the group's queues
_SUMMED = ("stubs", "deliveries", "lost", "stuck", "dead", "unsent", "duplicate_deliveries", "lag")

#: the figures of a group's tiles: (tile label, counter); the first one is the unit of the schema version
GROUP_TILES = (
    ("deliveries", "deliveries"),
    ("lost", "lost"),
    ("stuck", "stuck"),
    ("dead", "dead"),
    ("unsent", "unsent"),
    ("duplicate deliveries", "duplicate_deliveries"),
    ("lag", "lag"),
    ("never consumed", "never_consumed_queues"),
)


#: figures measured in offsets: not computed on a RabbitMQ queue (summary ``queues[].offsets`` false)
OFFSET_FIGURES = frozenset({"lag", "gaps", "missing_offsets", "offset gaps"})


@dataclass(frozen=True)
class Tile:
    key: str
    value: int
    bad: bool
    #: not applicable: every queue of the tile's scope is a RabbitMQ queue, whose positions are no offsets
    na: bool = False


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
    #: queues a group has messages on but never consumed (schema_version 2; empty before)
    never_consumed: list[Mapping[str, Any]]
    schema_version: int
    #: why deliveries are missing: the journal of part of the window was purged (``None``: nothing purged)
    journal_note: str | None = None


def without_offsets(queues: Sequence[Mapping[str, Any]]) -> bool:
    """Whether none of ``queues`` has offsets (all RabbitMQ queues; an older summary has no such key)."""
    return bool(queues) and all(q.get("offsets", True) is False for q in queues)


def _tiles(pairs: Sequence[tuple[str, int]], no_offsets: bool = False) -> list[Tile]:
    return [
        Tile(k, int(v), k in BAD_WHEN_POSITIVE and bool(v), na=no_offsets and k in OFFSET_FIGURES)
        for k, v in pairs
    ]


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


def unit(row: Mapping[str, Any]) -> tuple[str, str]:
    """(label, key) of what a row counts: ``inbox rows`` (schema_version 2) or ``stubs`` (1)."""
    return ("inbox rows", "inbox_rows") if "inbox_rows" in row else ("stubs", "stubs")


def _group_rows(summary: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Each group's own figures: the summary's ``groups`` (v2) or its queues summed (v1)."""
    if "groups" in summary:
        return {str(g["consumer_group"]): g for g in summary["groups"]}
    out: dict[str, Mapping[str, Any]] = {}
    sums: dict[str, dict[str, Any]] = {}
    for q in summary["queues"]:
        g = sums.setdefault(str(q["consumer_group"]), {"consumer_group": q["consumer_group"]})
        out[str(q["consumer_group"])] = g
        for key in _SUMMED:
            g[key] = g.get(key, 0) + int(q[key])
        causes = g.setdefault("duplicates_by_cause", {})
        for cause, n in q["duplicates_by_cause"].items():
            causes[cause] = causes.get(cause, 0) + int(n)
    return out


def _group_views(summary: Mapping[str, Any]) -> list[GroupView]:
    timelines = (summary.get("timeline") or {}).get("groups", {})
    out = []
    for name, g in sorted(_group_rows(summary).items()):
        label, key = unit(g)
        pairs = [(label, key), *((lb, k) for lb, k in GROUP_TILES if k in g)]
        queues = [q for q in summary["queues"] if str(q["consumer_group"]) == name]
        out.append(
            GroupView(
                name=name,
                tiles=_tiles([(lb, int(g[k])) for lb, k in pairs], without_offsets(queues)),
                queues=queues,
                duplicates_by_cause=dict(g.get("duplicates_by_cause", {})),
                timeline=timeline_view(timelines.get(name, [])),
            )
        )
    return out


def _ids(entry: Mapping[str, Any]) -> list[str]:
    """The first ids of an attention entry: ``message_ids`` (v1) or ``group  message_id`` pairs (v2)."""
    if "message_ids" in entry:
        return [str(i) for i in entry["message_ids"]]
    return [f"{p['consumer_group']}  {p['message_id']}" for p in entry.get("pairs", [])]


def _attention(summary: Mapping[str, Any]) -> list[AttentionView]:
    entries = summary["attention"]
    out = []
    for cause, meaning in ATTENTION.items():
        entry = entries.get(cause) or {"total": 0, "message_ids": []}
        breakdown = dict(summary["duplicates_by_cause"]) if cause == "duplicates" else {}
        out.append(AttentionView(cause, meaning, int(entry["total"]), _ids(entry), breakdown))
    return sorted(out, key=lambda a: a.total == 0)  # the ones with something in them first, order kept


def journal_note(summary: Mapping[str, Any]) -> str | None:
    """A sentence for a window whose journal was (partly) purged: confirmed pairs without a delivery row.

    Without it a window over purged days shows every pair confirmed and zero deliveries, with no reason."""
    journal = (summary.get("timeline") or {}).get("journal") or {}
    unlogged = int(journal.get("unlogged_confirmed") or 0)
    if not unlogged:
        return None
    first = journal.get("first_delivery")
    where = f"its deliveries start at {first}" if first else "it holds no delivery of this window"
    pairs = f"{unlogged} confirmed (group, message) pair{'s' if unlogged != 1 else ''}"
    return (
        f"Journal purged: {pairs} of this window have no delivery row left in message_log (the log "
        f"retention deleted them; {where}). They count as delivered at their confirmation in the backlog; "
        "their deliveries, duplicates and delivery latency are not in this report."
    )


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
        tiles=_tiles(headline(summary), without_offsets(summary["queues"])),
        timeline=timeline_view((summary.get("timeline") or {}).get("all", [])),
        groups=_group_views(summary),
        queues=list(summary["queues"]),
        latency_ms=summary["latency_ms"],
        latency_histogram=summary["latency_histogram"],
        resend_histogram=list(summary["resend_histogram"]),
        duplicates_by_cause=dict(summary["duplicates_by_cause"]),
        attention=_attention(summary),
        never_consumed=list(summary.get("never_consumed", [])),
        schema_version=int(summary["schema_version"]),
        journal_note=journal_note(summary),
    )
