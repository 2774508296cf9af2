"""``report.html``: one self-contained page rendered from the report's view-model.

No network at all when the page is opened (it is often mailed or attached to a ticket): the CSS is inline and
the charts are SVG drawn here, so there is no script to load and nothing for a browser to block. Every value
is HTML-escaped; topic and group names come from producers and must not inject markup.

Layout, top to bottom: status and headline tiles; the timeline (what happened when); one section per
consumer group (its tiles, its queues, its own timeline); latency; distribution charts; the messages needing
attention, grouped by cause with counts and the first ids. Wide tables scroll inside their own box, so the
page itself never scrolls sideways — on a phone as on a laptop. The figures come from
:func:`reliable.reconcile.report_view.report_view`; this module only lays them out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from reliable.reconcile.report_svg import Layer, bar_chart, fmt, timeline_chart
from reliable.reconcile.report_view import (
    OFFSET_FIGURES,
    AttentionView,
    GroupView,
    ReportView,
    Tile,
    TimelineView,
    report_view,
    unit,
)

__all__ = ["bar_chart", "render_html", "render_view"]

_CSS = """
*{box-sizing:border-box}
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#1d2330;background:#f7f8fa}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}h3{font-size:14px;margin:12px 0 6px}
.meta{color:#5b6475;margin-bottom:16px;overflow-wrap:anywhere}
.tiles{display:flex;flex-wrap:wrap;gap:10px}
.tile{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:10px 14px;min-width:110px}
.tile .v{font-size:24px;font-weight:600}.tile .k{color:#5b6475;font-size:12px;text-transform:uppercase}
.tile.bad{border-color:#d33;background:#fff3f3}.tile.bad .v{color:#b00}
.status{display:inline-block;padding:4px 10px;border-radius:4px;font-weight:600;overflow-wrap:anywhere}
.status.ok{background:#e3f6e8;color:#17692d}.status.fail{background:#fde4e4;color:#a01010}
.scroll{max-width:100%;overflow-x:auto;border:1px solid #dde1e8;border-radius:6px;background:#fff}
table{border-collapse:collapse;font-size:13px;width:100%}
th,td{border-bottom:1px solid #e6e9ef;padding:4px 8px;text-align:right;white-space:nowrap}
th{background:#eef0f4;position:sticky;top:0}
td.l,th.l{text-align:left}td.bad,.warn{color:#b00;font-weight:600}
tr>td:first-child{position:sticky;left:0;background:#fff}tr>th:first-child{left:0;z-index:1}
.charts{display:flex;flex-wrap:wrap;gap:16px}
.chart{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:8px;max-width:100%;overflow-x:auto}
.chart h3{font-size:13px;margin:0 0 4px}
.tlgrid{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,480px),1fr));gap:16px}
svg.tl{width:100%;height:auto;display:block}svg.bar{max-width:100%;height:auto}
.legend{font-size:12px;color:#5b6475}.key{margin-right:12px;white-space:nowrap}
.key i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px}
section.group{border-top:2px solid #dde1e8;margin-top:28px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(280px,1fr));gap:12px}
.card{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:10px;min-width:0}
.card.hot{border-color:#d33}.card .n{font-size:20px;font-weight:600}.card p{margin:4px 0;color:#5b6475}
.ids{font-family:ui-monospace,monospace;font-size:12px;max-height:160px;overflow:auto;white-space:pre-wrap;
overflow-wrap:anywhere}
@media (max-width:600px){body{margin:10px}.tile{min-width:90px;padding:6px 10px}.tile .v{font-size:18px}}
"""

#: colours of the duplicate causes (timeline and charts)
_CAUSE_COLORS = ("#d0792b", "#c7a23a", "#8a63c7", "#4aa3b5", "#b5527a")
_FRESH = "#4a78c2"


def _tiles(tiles: Sequence[Tile], ident: str = "") -> str:
    attr = f' id="{escape(ident)}"' if ident else ""
    cells = "".join(
        f'<div class="tile{" bad" if t.bad else ""}" '
        f'data-key="{escape(t.key)}"><div class="v">{"n/a" if t.na else fmt(t.value)}</div>'
        f'<div class="k">{escape(t.key)}</div></div>'
        for t in tiles
    )
    return f"<div class='tiles'{attr}>{cells}</div>"


#: after the first column (``stubs`` or ``inbox rows``, by schema version: report_view.unit)
_QUEUE_COLS = (
    ("pending", "pending"),
    ("confirmed", "confirmed"),
    ("voided", "voided"),
    ("dead", "dead"),
    ("max offset", "max_stub_offset"),
    ("watermark", "watermark"),
    ("lag", "lag"),
    ("lost", "lost"),
    ("stuck", "stuck"),
    ("unsent", "unsent"),
    ("deliveries", "deliveries"),
    ("duplicates", "duplicate_deliveries"),
    ("orphans", "orphan_logs"),
    ("gaps", "gaps"),
)
_BAD_COLS = {"dead", "lost", "stuck", "unsent", "orphan_logs", "gaps", "never_consumed_queues"}


def _cell(q: Mapping[str, Any], key: str) -> str:
    """A queue's figure; ``n/a`` for lag and gaps on a RabbitMQ queue (its positions are no offsets)."""
    if key in OFFSET_FIGURES and q.get("offsets", True) is False and not q[key]:
        return "n/a"
    return fmt(q[key])


def _queue_table(queues: Sequence[Mapping[str, Any]], ident: str) -> str:
    cols = (unit(queues[0]) if queues else ("stubs", "stubs"), *_QUEUE_COLS)
    head = '<tr><th class="l">group</th><th class="l">topic</th><th>queue</th>' + "".join(
        f"<th>{escape(t)}</th>" for t, _ in cols
    )
    head += "<th>p50 first delivery ms</th><th>p99 first delivery ms</th></tr>"
    rows = []
    for q in queues:
        lat = q["latency_ms"]["send_to_first_delivery"]
        cells = "".join(
            f'<td class="{"bad" if k in _BAD_COLS and q[k] else ""}" data-col="{k}">{_cell(q, k)}</td>'
            for _, k in cols
        )
        never = ' <span class="warn">never consumed</span>' if q.get("never_consumed") else ""
        rows.append(
            f'<tr><td class="l">{escape(str(q["consumer_group"]))}</td>'
            f'<td class="l">{escape(str(q["topic"]))}</td>'
            f"<td>{escape(_on(q))}{fmt(q['queue_id'])}{never}</td>{cells}<td>{fmt(lat['p50'])}</td><td>{fmt(lat['p99'])}</td></tr>"
        )
    if not rows:
        rows.append(f'<tr><td class="l" colspan="{len(cols) + 5}">no queues: the inputs are empty</td></tr>')
    return f'<div class="scroll"><table id="{escape(ident)}">{head}{"".join(rows)}</table></div>'


def _latency_table(latency: Mapping[str, Mapping[str, Any]]) -> str:
    keys = ("count", "p50", "p95", "p99", "max")
    head = "<tr><th class='l'>latency (ms)</th>" + "".join(f"<th>{k}</th>" for k in keys) + "</tr>"
    rows = "".join(
        f'<tr><td class="l">{escape(name.replace("_", " "))}</td>'
        + "".join(f"<td>{fmt(v[k])}</td>" for k in keys)
        + "</tr>"
        for name, v in latency.items()
    )
    return f'<div class="scroll"><table id="latency">{head}{rows}</table></div>'


def _timeline(t: TimelineView | None, ident: str, compact: bool = False) -> str:
    if t is None:
        return "<p class='meta'>no timeline in this summary (no deliveries or stubs in the window)</p>"
    dup_layers = [
        Layer(f"duplicate: {cause}", _CAUSE_COLORS[i % len(_CAUSE_COLORS)], values)
        for i, (cause, values) in enumerate(t.duplicates.items())
    ]
    # (id suffix, title, layers, kind); a group's section shows the first two
    specs: list[tuple[str, str, list[Layer], str]] = [
        (
            "deliveries",
            "Deliveries per minute (fresh and duplicates by cause)",
            [Layer("fresh", _FRESH, t.fresh), *dup_layers],
            "bars",
        ),
        ("backlog", "Backlog: staged, not yet delivered", [Layer("backlog", "#b00", t.backlog)], "line"),
        ("resends", "Resends per minute", [Layer("resends", "#8a63c7", t.resends)], "bars"),
        ("p95", "p95 send → first delivery (ms)", [Layer("p95 ms", "#2e9b6a", t.p95_ms)], "line"),
    ]
    charts = [
        timeline_chart(title, t.minutes, layers, kind=kind, chart_id=f"{ident}-{suffix}")
        for suffix, title, layers, kind in (specs[:2] if compact else specs)
    ]
    return f"<div class='tlgrid'>{''.join(charts)}</div>"


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name)


def _groups_table(groups: Sequence[GroupView]) -> str:
    """One row per group, its tiles as columns, the name linking to the group's section."""
    if not groups:
        return '<p id="groups">no consumer groups</p>'
    keys = list(dict.fromkeys(t.key for g in groups for t in g.tiles))
    head = '<tr><th class="l">group</th>' + "".join(f"<th>{escape(k)}</th>" for k in keys) + "</tr>"
    rows = []
    for g in groups:
        by_key = {t.key: t for t in g.tiles}
        cells = "".join(
            f'<td class="{"bad" if k in by_key and by_key[k].bad else ""}" data-col="{escape(k)}">'
            f"{fmt(by_key[k].value if k in by_key else None)}</td>"
            for k in keys
        )
        link = f'<a href="#group-{escape(_slug(g.name))}">{escape(g.name)}</a>'
        rows.append(f'<tr><td class="l">{link}</td>{cells}</tr>')
    return f'<div class="scroll"><table id="groups">{head}{"".join(rows)}</table></div>'


def _group(g: GroupView) -> str:
    slug = _slug(g.name)
    return (
        f'<section class="group" id="group-{escape(slug)}" data-group="{escape(g.name)}">'
        f"<h2>Group {escape(g.name)}</h2>{_tiles(g.tiles, f'tiles-{slug}')}"
        f"<h3>Queues</h3>{_queue_table(g.queues, f'queues-{slug}')}"
        f"<h3>Timeline</h3>{_timeline(g.timeline, f'tl-{slug}', compact=True)}</section>"
    )


def _attention(items: Sequence[AttentionView]) -> str:
    cards = []
    for a in items:
        ids = "\n".join(escape(i) for i in a.first_ids)
        more = f"\n… and {a.more:,} more in {escape(a.cause)}.parquet" if a.more else ""
        breakdown = "".join(
            f'<div data-cause="{escape(c)}">{escape(c)}: {fmt(n)}</div>' for c, n in a.breakdown.items()
        )
        body = f'<div class="ids" id="ids-{escape(a.cause)}">{ids}{more}</div>' if a.total else ""
        cards.append(
            f'<div class="card{" hot" if a.total and a.cause != "duplicates" else ""}" '
            f'data-attention="{escape(a.cause)}"><h3>{escape(a.cause)}</h3>'
            f'<div class="n">{fmt(a.total)}</div>'
            f"<p>{escape(a.meaning)}</p>{breakdown}{body}</div>"
        )
    return f"<div class='cards' id='attention'>{''.join(cards)}</div>"


def _never_consumed(entries: Sequence[Mapping[str, Any]]) -> str:
    if not entries:
        return ""
    items = "".join(
        f"<li>{escape(str(e['consumer_group']))} never consumed {escape(str(e['topic']))} queue "
        f"{escape(_on(e))}{fmt(e['queue_id'])} ({fmt(e.get('pending'))} pending)</li>"
        for e in entries
    )
    return f'<h3>Never consumed</h3><ul id="never-consumed" class="warn">{items}</ul>'


def _on(q: Mapping[str, Any]) -> str:
    """``broker-b:`` before a queue id on a RocketMQ cluster (schema_version 3); nothing without groups."""
    broker = q.get("broker_name") or ""
    return f"{broker}:" if broker else ""


def _queue_name(q: Mapping[str, Any]) -> str:
    qid = "unsent" if q["queue_id"] is None else str(q["queue_id"])
    return f"{q['consumer_group']}/{q['topic']}/{_on(q)}{qid}"


def _charts(v: ReportView) -> str:
    hist = v.latency_histogram
    lagging = [q for q in v.queues if q.get("offsets", True) is not False]
    charts = [
        bar_chart(  # RabbitMQ queues have no offsets, hence no lag
            "Lag per queue (offsets)", [_queue_name(q) for q in lagging], [q["lag"] for q in lagging]
        ),
        bar_chart(
            "Send → first delivery (per bucket)",
            hist["buckets"],
            hist["send_to_first_delivery"],
            color="#2e9b6a",
        ),
        bar_chart("Send → confirm (per bucket)", hist["buckets"], hist["send_to_confirm"], color="#2e9b6a"),
        bar_chart(
            "Messages by send count",
            [r["label"] for r in v.resend_histogram],
            [r.get("messages", r.get("stubs", 0)) for r in v.resend_histogram],
            color="#8a63c7",
        ),
        bar_chart(
            "Duplicate deliveries by cause",
            list(v.duplicates_by_cause),
            list(v.duplicates_by_cause.values()),
            color="#d0792b",
        ),
    ]
    return f"<div class='charts' id='charts'>{''.join(charts)}</div>"


def render_view(v: ReportView) -> str:
    """The whole page for a view-model."""
    status = f'<span class="status {"ok" if v.ok else "fail"}" id="status">{escape(v.status)}</span>'
    groups = "".join(_group(g) for g in v.groups)
    note = "" if v.journal_note is None else f"<p class='meta' id='journal-note'>{escape(v.journal_note)}</p>"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>Reconciliation report</title><style>{_CSS}</style></head><body>"
        f"<h1>Reconciliation report</h1><div class='meta'>{escape(v.meta)}</div>{status}"
        f"<h2>Headline</h2>{_tiles(v.tiles, 'headline')}{note}"
        f"<h2>Consumer groups</h2>{_groups_table(v.groups)}"
        f"<h2>Timeline (all groups, per minute)</h2>{_timeline(v.timeline, 'tl-all')}"
        f"{groups}"
        f"<h2>All queues</h2>{_queue_table(v.queues, 'queues')}"
        f"<h2>Latency</h2>{_latency_table(v.latency_ms)}"
        f"<h2>Distributions</h2>{_charts(v)}"
        f"<h2>Messages needing attention</h2>{_never_consumed(v.never_consumed)}{_attention(v.attention)}"
        f"<p class='meta'>summary.json schema_version {v.schema_version}</p>"
        "</body></html>\n"
    )


def render_html(summary: Mapping[str, Any]) -> str:
    """The whole page for a summary dictionary (summary.json)."""
    return render_view(report_view(summary))
