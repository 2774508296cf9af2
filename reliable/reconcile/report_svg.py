"""The report's charts as inline SVG: horizontal bars for per-queue figures, a per-minute timeline chart.

Why hand-drawn SVG: the page must open offline from a mail attachment, so no chart library can be loaded.
Each chart scales to its box (``viewBox`` + ``width:100%``), so it fits a phone as well as a laptop; every
bar and point carries a ``<title>`` (the browser's tooltip) with the full label and value, and
``data-*`` attributes with the exact figure (the render test reads those, people read the tooltip). Labels
too long for the label column are shortened with an ellipsis and keep their full text in the tooltip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

#: average glyph width of the 12px label font, for sizing the label column
_CHAR_PX = 7.0
_LABEL_MAX_PX = 300


def fmt(value: Any) -> str:
    """A figure as the page shows it (thousands separators, one decimal, en dash for none), escaped."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return escape(str(value))


def compact(value: float) -> str:
    """An axis figure in at most ~6 characters: 950, 12.5k, 3.4M."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def fit_label(label: str, max_px: float) -> str:
    """``label`` if it fits ``max_px``, else its head with an ellipsis (the full text goes in a tooltip)."""
    room = int(max_px / _CHAR_PX)
    return label if len(label) <= room else label[: max(1, room - 1)] + "…"


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float], *, color: str = "#4a78c2") -> str:
    """A horizontal bar chart: one bar per label, the value printed at the bar's end, tooltips on each."""
    bar_h, gap, plot_w = 18, 6, 260
    longest = max((len(lb) for lb in labels), default=4)
    label_w = min(_LABEL_MAX_PX, max(60.0, longest * _CHAR_PX + 8))
    width = label_w + plot_w + 70
    height = max(1, len(labels)) * (bar_h + gap) + gap
    top = max([float(v) for v in values] or [0.0]) or 1.0
    parts = [
        f'<svg viewBox="0 0 {width:.0f} {height}" width="{width:.0f}" class="bar" role="img" '
        f'aria-label="{escape(title)}">'
    ]
    if not labels:
        parts.append(f'<text x="4" y="{bar_h}" font-size="12" fill="#5b6475">no data</text>')
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        y = gap + i * (bar_h + gap)
        w = 0 if value <= 0 else max(1.0, plot_w * float(value) / top)
        tip = f"<title>{escape(label)}: {fmt(value)}</title>"
        parts.append(
            f'<g data-label="{escape(label)}" data-value="{value}">{tip}'
            f'<text x="{label_w - 6:.0f}" y="{y + bar_h - 5}" font-size="12" text-anchor="end">'
            f"{escape(fit_label(label, label_w - 10))}</text>"
            f'<rect x="{label_w:.0f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>'
            f'<text x="{label_w + w + 4:.1f}" y="{y + bar_h - 5}" font-size="12">{fmt(value)}</text></g>'
        )
    parts.append("</svg>")
    return f'<div class="chart"><h3>{escape(title)}</h3>{"".join(parts)}</div>'


@dataclass(frozen=True)
class Layer:
    """One series of a timeline chart (stacked on the previous layers when the chart is a bar chart)."""

    name: str
    color: str
    values: Sequence[float | None]


def _legend(layers: Sequence[Layer]) -> str:
    return "".join(
        f'<span class="key"><i style="background:{layer.color}"></i>{escape(layer.name)}</span>'
        for layer in layers
    )


def timeline_chart(
    title: str, minutes: Sequence[str], layers: Sequence[Layer], *, kind: str = "bars", chart_id: str = ""
) -> str:
    """Per-minute chart: stacked bars (``kind="bars"``) or one line per layer (``kind="line"``).

    Every minute of every layer is a ``<g data-series data-minute data-value>`` with a tooltip, so the exact
    figure behind each bar or point can be read (and tested) without guessing pixel heights.
    """
    width, height, left, bottom, top_pad = 640.0, 170.0, 48.0, 22.0, 8.0
    plot_w, plot_h = width - left - 8, height - bottom - top_pad
    n = max(1, len(minutes))
    step = plot_w / n
    if kind == "bars":
        sums = [sum(float(layer.values[i] or 0) for layer in layers) for i in range(len(minutes))]
        top = max(sums or [0.0]) or 1.0
    else:
        top = max((float(v) for layer in layers for v in layer.values if v is not None), default=0.0) or 1.0
    parts = [
        f'<svg viewBox="0 0 {width:.0f} {height:.0f}" class="tl" role="img" aria-label="{escape(title)}">',
        f'<line x1="{left}" y1="{top_pad + plot_h}" x2="{width - 8}" y2="{top_pad + plot_h}" stroke="#aab"/>',
        f'<text x="{left - 4}" y="{top_pad + 10}" font-size="11" text-anchor="end">{compact(top)}</text>',
        f'<text x="{left - 4}" y="{top_pad + plot_h}" font-size="11" text-anchor="end">0</text>',
    ]
    if minutes:
        parts.append(
            f'<text x="{left}" y="{height - 6}" font-size="11">{escape(minutes[0])}</text>'
            f'<text x="{width - 8}" y="{height - 6}" font-size="11" text-anchor="end">'
            f"{escape(minutes[-1])}</text>"
        )
    else:
        parts.append(f'<text x="{left + 4}" y="{top_pad + 20}" font-size="12" fill="#5b6475">no data</text>')
    base = [0.0] * len(minutes)
    radius = 2.5 if len(minutes) <= 60 else 1.2
    for layer in layers:
        points: list[str] = []
        for i, minute in enumerate(minutes):
            raw = layer.values[i]
            value = float(raw or 0)
            tip = f"<title>{escape(minute)} · {escape(layer.name)}: {fmt(raw)}</title>"
            x = left + i * step
            attrs = (
                f'data-series="{escape(layer.name)}" data-minute="{escape(minute)}" data-value="{fmt(raw)}"'
            )
            if kind == "bars":
                h = plot_h * value / top
                y = top_pad + plot_h - base[i] - h
                parts.append(
                    f'<g {attrs}>{tip}<rect x="{x + step * 0.1:.2f}" y="{y:.2f}" width="{step * 0.8:.2f}" '
                    f'height="{h:.2f}" fill="{layer.color}"/></g>'
                )
                base[i] += h
            elif raw is not None:
                cx, cy = x + step / 2, top_pad + plot_h - plot_h * value / top
                points.append(f"{cx:.2f},{cy:.2f}")
                parts.append(
                    f'<g {attrs}>{tip}<circle cx="{cx:.2f}" cy="{cy:.2f}" r="{radius}" '
                    f'fill="{layer.color}"/></g>'
                )
        if kind == "line" and len(points) > 1:
            parts.append(
                f'<polyline points="{" ".join(points)}" fill="none" stroke="{layer.color}" '
                'stroke-width="1.5"/>'
            )
    parts.append("</svg>")
    ident = f' id="{escape(chart_id)}"' if chart_id else ""
    return (
        f'<div class="chart wide"{ident}><h3>{escape(title)}</h3>{"".join(parts)}'
        f'<div class="legend">{_legend(layers)}</div></div>'
    )
