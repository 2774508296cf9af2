"""``report.html``: one self-contained page rendered from the summary dictionary.

No network at all when the page is opened (it is often mailed or attached to a ticket): the CSS is inline and
the charts are SVG drawn here, so there is no script to load and nothing for a browser to block. Every value
is HTML-escaped; topic and group names come from producers and must not inject markup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from reliable.reconcile.summary import headline

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#1d2330;background:#f7f8fa}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.meta{color:#5b6475;margin-bottom:16px}
.tiles{display:flex;flex-wrap:wrap;gap:10px}
.tile{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:10px 14px;min-width:110px}
.tile .v{font-size:24px;font-weight:600}.tile .k{color:#5b6475;font-size:12px;text-transform:uppercase}
.tile.bad{border-color:#d33;background:#fff3f3}.tile.bad .v{color:#b00}
.status{display:inline-block;padding:4px 10px;border-radius:4px;font-weight:600}
.status.ok{background:#e3f6e8;color:#17692d}.status.fail{background:#fde4e4;color:#a01010}
table{border-collapse:collapse;background:#fff;font-size:13px}
th,td{border:1px solid #dde1e8;padding:4px 8px;text-align:right}th{background:#eef0f4}
td.l,th.l{text-align:left}td.bad,.bad{color:#b00;font-weight:600}
.charts{display:flex;flex-wrap:wrap;gap:16px}
.chart{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:8px}
.chart h3{font-size:13px;margin:0 0 4px}
.ids{font-family:ui-monospace,monospace;font-size:12px;background:#fff;border:1px solid #dde1e8;padding:6px;
max-height:160px;overflow:auto;white-space:pre-wrap}
"""

_BAD_WHEN_POSITIVE = {"lost", "stuck", "dead", "unsent", "never consumed", "orphan logs", "offset gaps"}
#: counters that are a finding (shown in red when not zero) in the group and queue tables
_BAD = {"dead", "lost", "stuck", "unsent", "orphan_logs", "gaps", "never_consumed_queues"}


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return escape(str(value))


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float], *, color: str = "#4a78c2") -> str:
    """A horizontal bar chart as inline SVG (one bar per label, value printed at the bar's end)."""
    bar_h, gap, label_w, plot_w = 18, 6, 150, 260
    height = max(1, len(labels)) * (bar_h + gap) + gap
    top = max([float(v) for v in values] or [0.0]) or 1.0
    parts = [
        f'<svg width="{label_w + plot_w + 70}" height="{height}" role="img" aria-label="{escape(title)}">'
    ]
    if not labels:
        parts.append(f'<text x="4" y="{bar_h}" font-size="12" fill="#5b6475">no data</text>')
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        y = gap + i * (bar_h + gap)
        w = 0 if value <= 0 else max(1.0, plot_w * float(value) / top)
        parts.append(
            f'<text x="{label_w - 6}" y="{y + bar_h - 5}" font-size="12" '
            f'text-anchor="end">{escape(label)}</text>'
            f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>'
            f'<text x="{label_w + w + 4:.1f}" y="{y + bar_h - 5}" font-size="12">{_fmt(value)}</text>'
        )
    parts.append("</svg>")
    return f'<div class="chart"><h3>{escape(title)}</h3>{"".join(parts)}</div>'


def _queue_name(q: Mapping[str, Any]) -> str:
    qid = "unsent" if q["queue_id"] is None else str(q["queue_id"])
    return f"{q['consumer_group']}/{q['topic']}/{qid}"


def _cell(row: Mapping[str, Any], key: str) -> str:
    return f'<td class="{"bad" if key in _BAD and row[key] else ""}">{_fmt(row[key])}</td>'


_GROUP_COLS = [
    ("inbox rows", "inbox_rows"),
    ("pending", "pending"),
    ("confirmed", "confirmed"),
    ("voided", "voided"),
    ("dead", "dead"),
    ("lost", "lost"),
    ("stuck", "stuck"),
    ("unsent", "unsent"),
    ("never consumed queues", "never_consumed_queues"),
    ("lag", "lag"),
    ("deliveries", "deliveries"),
    ("duplicates", "duplicate_deliveries"),
    ("orphans", "orphan_logs"),
    ("gaps", "gaps"),
]


def _group_table(groups: Sequence[Mapping[str, Any]]) -> str:
    head = '<tr><th class="l">group</th>' + "".join(f"<th>{escape(t)}</th>" for t, _ in _GROUP_COLS)
    head += "<th>p50 confirm ms</th><th>p99 confirm ms</th></tr>"
    rows = []
    for g in groups:
        lat = g["latency_ms"]["send_to_confirm"]
        cells = "".join(_cell(g, k) for _, k in _GROUP_COLS)
        rows.append(
            f'<tr><td class="l">{escape(g["consumer_group"])}</td>{cells}'
            f"<td>{_fmt(lat['p50'])}</td><td>{_fmt(lat['p99'])}</td></tr>"
        )
    if not rows:
        rows.append(f'<tr><td class="l" colspan="{len(_GROUP_COLS) + 3}">no consumer groups</td></tr>')
    return f'<table id="groups">{head}{"".join(rows)}</table>'


def _queue_table(queues: Sequence[Mapping[str, Any]]) -> str:
    cols = [
        ("inbox rows", "inbox_rows"),
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
    ]
    head = '<tr><th class="l">group</th><th class="l">topic</th><th>queue</th>' + "".join(
        f"<th>{escape(t)}</th>" for t, _ in cols
    )
    head += "<th>p50 first delivery ms</th><th>p99 first delivery ms</th></tr>"
    rows = []
    for q in queues:
        lat = q["latency_ms"]["send_to_first_delivery"]
        cells = "".join(_cell(q, k) for _, k in cols)
        never = ' <span class="bad">never consumed</span>' if q.get("never_consumed") else ""
        rows.append(
            f'<tr><td class="l">{escape(q["consumer_group"])}</td><td class="l">{escape(q["topic"])}</td>'
            f"<td>{_fmt(q['queue_id'])}{never}</td>{cells}<td>{_fmt(lat['p50'])}</td>"
            f"<td>{_fmt(lat['p99'])}</td></tr>"
        )
    if not rows:
        rows.append(f'<tr><td class="l" colspan="{len(cols) + 5}">no queues: the inputs are empty</td></tr>')
    return f'<table id="queues">{head}{"".join(rows)}</table>'


def _never_consumed(entries: Sequence[Mapping[str, Any]]) -> str:
    if not entries:
        return '<p id="never-consumed">none: every group has consumed every queue it has messages on</p>'
    items = "".join(
        f"<li>{escape(e['consumer_group'])} never consumed {escape(e['topic'])} queue {_fmt(e['queue_id'])}"
        f" ({_fmt(e['inbox_rows'])} inbox rows, {_fmt(e['pending'])} pending)</li>"
        for e in entries
    )
    return f'<ul id="never-consumed" class="bad">{items}</ul>'


def _latency_table(latency: Mapping[str, Mapping[str, Any]]) -> str:
    head = "<tr><th class='l'>latency (ms)</th>" + "".join(
        f"<th>{k}</th>" for k in ("count", "p50", "p95", "p99", "max")
    )
    head += "</tr>"
    rows = "".join(
        f'<tr><td class="l">{escape(name.replace("_", " "))}</td>'
        + "".join(f"<td>{_fmt(v[k])}</td>" for k in ("count", "p50", "p95", "p99", "max"))
        + "</tr>"
        for name, v in latency.items()
    )
    return f'<table id="latency">{head}{rows}</table>'


def render_html(summary: Mapping[str, Any]) -> str:
    """The whole page as a string."""
    ok = bool(summary["ok"])
    window = summary["window"]
    meta = (
        f"source {escape(str(summary['source']))} · as of {escape(str(summary['as_of']))} · "
        f"window {escape(str(window['since'] or '−∞'))} … {escape(str(window['until'] or '+∞'))} · "
        f"generated {escape(str(summary['generated_at']))}"
    )
    status = (
        '<span class="status ok" id="status">OK: no threshold crossed</span>'
        if ok
        else '<span class="status fail" id="status">ALERT: '
        + escape(", ".join(f"{b['threshold']} {b['value']} > {b['limit']}" for b in summary["breaches"]))
        + "</span>"
    )
    tiles = "".join(
        f'<div class="tile{" bad" if name in _BAD_WHEN_POSITIVE and value else ""}" '
        f'data-key="{escape(name)}"><div class="v">{_fmt(value)}</div>'
        f'<div class="k">{escape(name)}</div></div>'
        for name, value in headline(summary)
    )
    queues = summary["queues"]
    charts = [
        bar_chart("Lag per queue (offsets)", [_queue_name(q) for q in queues], [q["lag"] for q in queues]),
        bar_chart(
            "Send → first delivery (inbox rows per bucket)",
            summary["latency_histogram"]["buckets"],
            summary["latency_histogram"]["send_to_first_delivery"],
            color="#2e9b6a",
        ),
        bar_chart(
            "Send → confirm (inbox rows per bucket)",
            summary["latency_histogram"]["buckets"],
            summary["latency_histogram"]["send_to_confirm"],
            color="#2e9b6a",
        ),
        bar_chart(
            "Messages by send count",
            [r["label"] for r in summary["resend_histogram"]],
            [r["messages"] for r in summary["resend_histogram"]],
            color="#8a63c7",
        ),
        bar_chart(
            "Duplicate deliveries by cause",
            list(summary["duplicates_by_cause"]),
            list(summary["duplicates_by_cause"].values()),
            color="#d0792b",
        ),
    ]
    lists = []
    for name, entry in summary["attention"].items():
        ids = [f"{p['consumer_group']}  {p['message_id']}" for p in entry["pairs"]]
        more = entry["total"] - len(ids)
        body = "\n".join(escape(i) for i in ids) or "none"
        if more > 0:
            body += f"\n… and {more:,} more (see {escape(name)}.parquet)"
        lists.append(
            f"<h3>{escape(name)} ({entry['total']:,} group/message pairs)</h3>"
            f'<div class="ids" id="ids-{escape(name)}">{body}</div>'
        )
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>Reconciliation report</title><style>{_CSS}</style></head><body>"
        f"<h1>Reconciliation report</h1><div class='meta'>{meta}</div>{status}"
        f"<h2>Headline</h2><div class='tiles' id='headline'>{tiles}</div>"
        f"<h2>Per consumer group</h2>{_group_table(summary['groups'])}"
        f"<h2>Never consumed</h2>{_never_consumed(summary['never_consumed'])}"
        f"<h2>Per queue</h2>{_queue_table(queues)}"
        f"<h2>Latency</h2>{_latency_table(summary['latency_ms'])}"
        f"<h2>Charts</h2><div class='charts'>{''.join(charts)}</div>"
        f"<h2>Messages needing attention</h2>{''.join(lists)}"
        f"<p class='meta'>summary.json schema_version {summary['schema_version']}</p>"
        "</body></html>\n"
    )
