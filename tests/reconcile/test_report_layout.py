"""The report as a person sees it: headless Chromium at a laptop and a phone width.

What a reader needs: every figure on the page is the figure in summary.json (headline, each group, the
timeline minute by minute, the attention cards), the page never scrolls sideways (wide tables scroll inside
their own box), and long group/topic names are shown whole or carry a tooltip. Screenshots of both widths
are kept in test-artifacts/ for a person to look at.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Mapping
from html import escape, unescape
from pathlib import Path
from typing import Any

import pytest

from reliable.reconcile.report_html import render_html
from reliable.reconcile.summary import headline as summary_headline
from tests import services
from tests.reconcile import report_data

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
WIDTHS = {"laptop": (1366, 900), "phone": (390, 844)}
#: headless Chromium will not make a window narrower than this; narrower screens are an iframe of that width
_MIN_WINDOW = 500

#: appended to a copy of the page only: measures the layout after load and writes it into the DOM
_PROBE = """<script>
addEventListener('load', () => {
  const vw = document.documentElement.clientWidth, out = [];
  const past = el => el.getBoundingClientRect().right > vw + 1;
  for (const el of document.querySelectorAll('body *')) {
    if (el.getBoundingClientRect().width && past(el) && !el.closest('.scroll') && !el.closest('.chart'))
      out.push(el.tagName + '.' + el.className + '#' + el.id);
  }
  const boxes = [...document.querySelectorAll('.scroll, .chart')].filter(past).length;
  const wide = b => b.scrollWidth > b.clientWidth;
  const scrolling = [...document.querySelectorAll('.scroll')].filter(wide).length;
  const page = document.documentElement.scrollWidth;
  (window.parent || window).document.body.dataset.layout = JSON.stringify({vw, page, out, boxes, scrolling});
});
</script></body>"""


def chromium(tmp_path: Path, size: tuple[int, int], *args: str) -> str:
    if not Path(CHROMIUM).exists():
        services.unavailable("chromium (make system-deps)")
    res = subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--window-size={size[0]},{size[1]}",
            "--virtual-time-budget=3000",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def number(text: str) -> int:
    return int(text.replace(",", ""))


def tiles(html: str) -> dict[str, int]:
    return {k: number(v) for k, v in re.findall(r'data-key="([^"]+)"><div class="v">([^<]+)</div>', html)}


def section(dom: str, ident: str) -> str:
    match = re.search(rf'<section class="group" id="{ident}".*?</section>', dom, re.S)
    assert match, ident
    return match.group(0)


def series(dom: str, chart_id: str) -> dict[str, dict[str, int]]:
    chart = re.search(rf'<div class="chart wide" id="{chart_id}">.*?</svg>', dom, re.S)
    assert chart, chart_id
    out: dict[str, dict[str, int]] = {}
    for name, minute, value in re.findall(
        r'data-series="([^"]+)" data-minute="([^"]+)" data-value="([^"]+)"', chart.group(0)
    ):
        out.setdefault(name, {})[minute] = number(value)
    return out


def group_sums(summary: Mapping[str, Any], group: str) -> dict[str, int]:
    queues = [q for q in summary["queues"] if q["consumer_group"] == group]
    keys = {"stubs": "stubs", "lost": "lost", "dead": "dead", "duplicate deliveries": "duplicate_deliveries"}
    return {label: sum(q[k] for q in queues) for label, k in keys.items()}


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory, artifacts_dir: Path) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("report")
    summary = report_data.summary()
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    html = render_html(json.loads((out / "summary.json").read_text()))  # what the runner renders from
    (out / "report.html").write_text(html)
    shutil.copy(out / "report.html", artifacts_dir / "report-layout.html")
    return out / "report.html", json.loads((out / "summary.json").read_text())


def test_figures_on_the_page_equal_summary_json(page: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, summary = page
    html = path.read_text()
    assert "http://" not in html and "https://" not in html and "<script" not in html, "self-contained"
    dom = chromium(tmp_path, WIDTHS["laptop"], "--dump-dom", path.as_uri())
    headline = tiles(dom.split('id="headline"', 1)[1].split("</div></div></div>", 1)[0] + "</div></div>")
    assert headline == dict(summary_headline(summary)), "every headline tile is its summary.json figure"
    for group in report_data.GROUPS:
        shown = tiles(section(dom, f"group-{group.replace('_', '-')}"))
        assert {k: shown[k] for k in group_sums(summary, group)} == group_sums(summary, group), group
    # the timeline, minute by minute: fresh + duplicates by cause = deliveries; resends; backlog
    deliveries = series(dom, "tl-all-deliveries")
    for point in summary["timeline"]["all"]:
        m = point["minute"]
        assert sum(s[m] for s in deliveries.values()) == point["deliveries"], m
        for cause, n in point["duplicates"].items():
            assert deliveries[f"duplicate: {cause}"][m] == n
    minutes = summary["timeline"]["all"]
    assert series(dom, "tl-all-resends")["resends"] == {p["minute"]: p["resends"] for p in minutes}
    assert series(dom, "tl-all-backlog")["backlog"] == {p["minute"]: p["backlog"] for p in minutes}
    assert len(deliveries["fresh"]) == 30, "quiet minutes are shown as zero, not skipped"
    # attention: grouped by cause, with the count and the first ids
    for cause, entry in summary["attention"].items():
        card = re.search(rf'data-attention="{cause}"><h3>{cause}</h3><div class="n">([^<]+)</div>', dom)
        assert card and number(card.group(1)) == entry["total"], cause
        for mid in entry["message_ids"]:
            assert mid in dom
    assert "… and 37 more in lost.parquet" in dom
    for cause, n in summary["duplicates_by_cause"].items():
        assert f'data-cause="{cause}">{cause}: {n:,}</div>' in dom
    # long labels are whole in the tables and carry a tooltip in the charts
    long_topic = report_data.TOPICS[1]
    assert f"<title>o_ledger_settlement_consumers/{long_topic}/1: " in dom


def framed(html: str, size: tuple[int, int]) -> str:
    """``html`` in a page of its own, inside an iframe of exactly ``size`` (its viewport is that wide)."""
    return (
        "<!DOCTYPE html><html><body style='margin:0'>"
        f"<iframe style='border:0;width:{size[0]}px;height:{size[1]}px' srcdoc=\"{escape(html)}\"></iframe>"
        "</body></html>"
    )


@pytest.mark.parametrize("device", list(WIDTHS))
def test_page_fits_the_screen_and_is_screenshotted(
    device: str, page: tuple[Path, dict[str, Any]], tmp_path: Path, artifacts_dir: Path
) -> None:
    path, _ = page
    width, height = WIDTHS[device]
    narrow = width < _MIN_WINDOW
    window = (max(width, _MIN_WINDOW), height)
    probe = tmp_path / "probe.html"
    probed = path.read_text().replace("</body>", _PROBE)
    probe.write_text(framed(probed, (width, height)) if narrow else probed)
    dom = chromium(tmp_path, window, "--dump-dom", probe.as_uri())
    found = re.search(r'data-layout="([^"]+)"', dom)
    assert found, "the layout probe did not run"
    layout = json.loads(unescape(found.group(1)))
    assert layout["vw"] == width, layout
    assert layout["page"] <= layout["vw"], f"the page scrolls sideways at {device} width: {layout}"
    assert layout["out"] == [] and layout["boxes"] == 0, layout
    if narrow:
        assert layout["scrolling"] > 0, "the wide tables scroll inside their box on a phone"
    shot = artifacts_dir / f"report-{device}.png"
    shot.unlink(missing_ok=True)
    full = tmp_path / "full.html"
    full.write_text(framed(path.read_text(), (width, 2400)) if narrow else path.read_text())
    chromium(tmp_path, (window[0], 2400), f"--screenshot={shot}", full.as_uri())
    assert shot.exists() and shot.stat().st_size > 10_000


def test_the_per_group_schema_is_shown_from_its_own_figures() -> None:
    """summary.json schema_version 2: each group's section shows the group's own figures (not queue sums),
    never-consumed queues are listed, and attention ids name their group."""
    summary = report_data.summary_v2()
    html = render_html(summary)
    for g in summary["groups"]:
        shown = tiles(section(html, f"group-{g['consumer_group'].replace('_', '-')}"))
        assert shown["inbox rows"] == g["inbox_rows"] and shown["lost"] == g["lost"]
        assert shown["never consumed"] == g["never_consumed_queues"]
    assert 'id="never-consumed"' in html and "audit never consumed DemoOrders queue 7" in html
    assert "audit  LOST-0" in html
    assert "<th>inbox rows</th>" in html and "<th>stubs</th>" not in html


def test_groups_at_a_glance_table_links_each_group_to_its_section() -> None:
    summary = report_data.summary_v2()
    html = render_html(summary)
    table = re.search(r'<table id="groups">.*?</table>', html, re.S)
    assert table
    for g in summary["groups"]:
        slug = g["consumer_group"].replace("_", "-")
        row = re.search(rf'<a href="#group-{slug}">[^<]+</a>.*?</tr>', table.group(0), re.S)
        assert row and f'id="group-{slug}"' in html
        cells = dict(re.findall(r'data-col="([^"]+)">([^<]+)</td>', row.group(0)))
        assert number(cells["inbox rows"]) == g["inbox_rows"] and number(cells["lag"]) == g["lag"]
