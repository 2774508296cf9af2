"""``reliable sweep`` says at start-up what would otherwise show at the first give-up, maybe weeks later (no
channel, a channel that does not answer), and a ``--once`` run leaves its metrics where a collector reads
them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker_sim.common.net import listen_port
from reliable import Reliability
from reliable.cli import main
from reliable.sweeper import WebhookChannel
from tests.sweeper.helpers import add_stub
from tests.sweeper.test_cli import PAST

SWEEP = ["sweep", "--once", "--sender", "tests.sweeper.senders:memory_sender"]


def _said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name == "reliable.sweeper"]


def test_a_sweeper_without_channels_says_its_notices_go_to_the_log_only(
    sqlite_url: str,
    sqlite_rel: Reliability,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RELIABLE_SMTP_HOST", raising=False)
    monkeypatch.delenv("RELIABLE_WEBHOOK_URL", raising=False)
    caplog.set_level(logging.INFO, logger="reliable.sweeper")
    assert main([*SWEEP, "--db", sqlite_url]) == 0
    assert any("DEAD notices go to this log only" in m for m in _said(caplog, logging.WARNING))


def test_a_channel_that_does_not_answer_at_start_up_is_an_error_and_the_round_still_runs(
    sqlite_url: str,
    sqlite_rel: Reliability,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    closed = str(listen_port())  # nothing listens there
    caplog.set_level(logging.INFO, logger="reliable.sweeper")
    smtp = [
        "--smtp-host",
        "127.0.0.1",
        "--smtp-port",
        closed,
        "--smtp-from",
        "a@x.org",
        "--smtp-to",
        "b@x.org",
    ]
    rc = main([*SWEEP, "--db", sqlite_url, *smtp, "--webhook", f"HTTP://127.0.0.1:{closed}/hook"])
    assert rc == 0 and capsys.readouterr().out.startswith("sweep round:")
    errors = _said(caplog, logging.ERROR)
    assert any("channel email does not answer at start-up" in m for m in errors)
    assert any("channel webhook does not answer at start-up" in m for m in errors)
    assert not any("log only" in m for m in _said(caplog, logging.WARNING))


def test_a_webhook_url_with_an_upper_case_scheme_is_accepted() -> None:
    assert WebhookChannel("HTTPS://hooks.example.org/x").url == "HTTPS://hooks.example.org/x"


def test_a_once_run_writes_its_metrics_for_the_textfile_collector(
    sqlite_url: str, sqlite_rel: Reliability, tmp_path: Path
) -> None:
    """Cron runs ``--once``: the process is gone before any scrape, so --metrics-port showed nothing."""
    add_stub(sqlite_rel, "cli-doomed", resend_at=PAST)
    path = tmp_path / "reliable_sweeper.prom"
    assert main([*SWEEP, "--db", sqlite_url, "--max-sends", "1", "--metrics-textfile", str(path)]) == 0
    lines = path.read_text().splitlines()
    assert any(line.startswith("reliable_sweeper_last_round_timestamp ") for line in lines)
    assert any(line.startswith("reliable_sweeper_dead_total ") for line in lines)
    assert (
        main([*SWEEP[:1], "--interval", "1m", *SWEEP[2:], "--db", sqlite_url, "--metrics-textfile", "x"]) == 2
    )
