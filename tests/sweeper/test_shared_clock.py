"""Sweepers on hosts whose clocks differ share one clock: the database server's.

What the review found: a claim moves its rows' ``resend_at`` to the claiming sweeper's now + the claim
window, and another sweeper compares ``resend_at`` with *its* now. With a host 90 s ahead of another (more
than the claim's last fifth), it re-claimed the rows the first was still sending: every row of the batch
sent twice, its budget spent twice. Each host's wall clock is given here as the clock's ``wall``; the round
runs on the database's time whatever it says.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import text

from reliable import Reliability
from reliable import constants as C
from reliable.cli import main as cli
from reliable.models import utcnow
from reliable.sweeper import FixedBackoff, Sweeper
from reliable.sweeper.errors import SweeperConfigError
from reliable.sweeper.shared_clock import DatabaseClock
from tests.sweeper.helpers import T0, QueueSender, add_stub, clean, get_inbox
from tests.sweeper.test_claim_window import BlockedSender


@pytest.fixture
def server_rel(server_url: str) -> Iterator[Reliability]:
    r = Reliability(server_url, redis_url="", max_sends=3)
    clean(r.engine)
    yield r
    r.close()


def host_clock(offset_s: float) -> Callable[[], dt.datetime]:
    """A host's wall clock ``offset_s`` away from the true time."""
    return lambda: utcnow() + dt.timedelta(seconds=offset_s)


def test_a_sweeper_on_a_host_ahead_does_not_claim_what_another_is_still_sending(
    server_rel: Reliability,
) -> None:
    due, staged = utcnow() - dt.timedelta(minutes=1), utcnow() - dt.timedelta(hours=2)
    for i in range(5):  # never sent: each is re-sent by whichever sweeper claims it
        add_stub(server_rel, f"skew-{i}", resend_at=due, last_sent_at=staged, created_at=staged)
    hung = BlockedSender()
    behind = Sweeper(
        server_rel,
        hung,
        backoff=FixedBackoff((3600.0,)),
        claim_ttl_s=60,
        clock=DatabaseClock(server_rel.engine, wall=host_clock(-45)),
    )
    ahead_sender = QueueSender()
    ahead = Sweeper(
        server_rel,
        ahead_sender,
        backoff=FixedBackoff((3600.0,)),
        claim_ttl_s=60,
        clock=DatabaseClock(server_rel.engine, wall=host_clock(+45)),
    )
    first = threading.Thread(target=behind.run_once, name="sweeper-behind")
    first.start()
    try:
        assert hung.entered.wait(30), "the first sweeper never sent"
        second = ahead.run_once()  # 90 s ahead of the first: past the first's claim by its own clock
        assert (second.selected, second.resent) == (0, 0)
        assert ahead_sender.sent == []
    finally:
        hung.release.set()
        first.join(30)
    assert all(get_inbox(server_rel, f"skew-{i}").resend_count == 1 for i in range(5))


def test_the_database_clock_tells_the_servers_time_and_moves_with_the_monotonic_clock(
    server_rel: Reliability,
) -> None:
    ticks = [100.0]
    clock = DatabaseClock(server_rel.engine, wall=host_clock(-3600), monotonic=lambda: ticks[0])
    clock.sync()
    sql = "SELECT CURRENT_TIMESTAMP" if server_rel.dialect == "postgresql" else "SELECT UTC_TIMESTAMP(6)"
    with server_rel.engine.connect() as conn:
        server = conn.execute(text(sql)).scalar_one()
    server = server if server.tzinfo is not None else server.replace(tzinfo=dt.UTC)
    assert abs((clock() - server).total_seconds()) < 2
    assert abs(clock.offset_s - 3600) < 2  # the host is an hour behind the database
    before = clock()
    ticks[0] += 7.5
    assert clock() - before == dt.timedelta(seconds=7.5)


@pytest.mark.parametrize("ttl_s", [C.MIN_CLAIM_TTL_S / 2, C.MAX_CLAIM_TTL_S * 2])
def test_a_claim_window_outside_its_bounds_is_refused(rel: Reliability, ttl_s: float) -> None:
    with pytest.raises(SweeperConfigError, match="claim_ttl must be between"):
        Sweeper(rel, QueueSender(), claim_ttl_s=ttl_s)


def test_the_cli_refuses_a_claim_window_in_one_line(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli(["sweep", "--db", db_url, "--once", "--claim-ttl", "100000d"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "claim_ttl must be between" in err[0]


def test_a_claim_window_that_runs_out_before_the_sends_says_so(
    rel: Reliability, caplog: pytest.LogCaptureFixture
) -> None:
    for i in range(3):
        add_stub(rel, f"slow-{i}")  # never sent: each is due for a send
    ticks = [T0]

    def clock() -> dt.datetime:  # each look at the clock is 2 s later: the 5 s window runs out at once
        ticks[0] += dt.timedelta(seconds=2)
        return ticks[0]

    sweeper = Sweeper(rel, QueueSender(), backoff=FixedBackoff((3600.0,)), claim_ttl_s=5, clock=clock)
    summary = sweeper.run_once()
    assert summary.resent < 3 and summary.released == 3 - summary.resent
    assert "raise --claim-ttl" in caplog.text
