"""report.html renders in headless Chromium, offline, and shows the headline numbers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests import services

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if not Path(CHROMIUM).exists():
        services.unavailable("chromium (make system-deps)")
    profile = tmp_path / "chromium-profile"
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_report_renders_in_chromium_with_headline_numbers(
    parquet_report: Any, tmp_path: Path, artifacts_dir: Path
) -> None:
    page = parquet_report.out_dir / "report.html"
    html = page.read_text()
    assert "http://" not in html and "https://" not in html, "the page must not fetch anything"
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "CONSOLE" not in dom.stderr, dom.stderr[-2000:]
    text = dom.stdout
    assert 'id="headline"' in text
    t = parquet_report.summary["totals"]
    for key, value in (
        ("inbox rows", t["inbox_rows"]), ("lost", t["lost"]),
        ("duplicate deliveries", 11), ("never consumed", 1),
    ):  # fmt: skip
        assert f'data-key="{key}"><div class="v">{value}</div>' in text, key
    assert "LOST-1" in text and "ORPHAN-1" in text and "targeted_resend" in text
    assert 'id="groups"' in text and "search never consumed orders queue 3" in text
    assert text.count('class="bar"') == 5, "five distribution charts"
    assert 'id="tl-all-deliveries"' in text and 'id="tl-all-backlog"' in text, "the timeline"
    shot = artifacts_dir / "reconcile-report.png"
    shot.unlink(missing_ok=True)
    res = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,2200", page.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 10_000
    shutil.copy(page, artifacts_dir / "reconcile-report.html")


def test_values_from_producers_are_escaped() -> None:
    from reliable.reconcile.config import ReconcileConfig, Thresholds
    from reliable.reconcile.report_html import render_html
    from reliable.reconcile.summary import Collected, build_summary

    row = {"consumer_group": "<g>", "topic": "t&<script>", "queue_id": 0, "level": "queue", "inbox_rows": 1}
    summary = build_summary(Collected(pair_stats=[row]), ReconcileConfig(), Thresholds(), source="<db>")
    html = render_html(summary)
    assert "<script>" not in html and "t&amp;&lt;script&gt;" in html and "&lt;db&gt;" in html
