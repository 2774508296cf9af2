"""A sweeper run once a round — cron's ``reliable sweep --once``, a documented way to run it — Redis down.

A long-running sweeper whose Redis lease reads fail for longer than ``stuck_after`` says so: the gauge
``reliable_sweeper_redis_unreadable_seconds`` and an ERROR a round. Until 2026-11-30 the outage's start
lived in the process, so a sweeper started afresh every minute by cron began from zero each run: Redis could
be down for days and the gauge stayed at 0, no ERROR was logged, nobody was told. Now the outage is an
episode in the database (the notice table, as a stalled group's is), shared by every sweeper and every run:
past ``stuck_after`` each run says so (the ERROR, the gauge counted from the outage's first failed read) and
one notice per outage goes to a person through the sweeper's channels; a read that answers ends the episode
(said in the log), and a later outage is a new one, told again.

Each run here is a process of its own: its own ``Reliability`` (engine, Redis client), its own ``Sweeper``,
and a gauge starting at 0; the sweeper's clock is moved between runs (no sleeps), a real redis-server is
stopped and started again.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis as redis_lib
from sqlalchemy import func, select

from reliable import Reliability
from reliable.cli import main
from reliable.models import StubNotification, utcnow
from reliable.sweeper import DeadNotice, FixedBackoff, NoticeKind, NotifyError, Sweeper, metrics
from reliable.sweeper.summary import RoundSummary
from tests.services import PrivateRedis
from tests.sweeper.helpers import (
    T0,
    Clock,
    MemoryChannel,
    QueueSender,
    add_log,
    add_stub,
    clean,
    outage_errors,
    set_progress,
    unreadable_seconds,
)

BACKOFF = FixedBackoff((10.0,))
STUCK_AFTER = dt.timedelta(seconds=600)


def connect(url: str) -> redis_lib.Redis:
    return redis_lib.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)


def reliability(db_url: str, redis_url: str) -> Reliability:
    return Reliability(
        db_url, redis=connect(redis_url), max_sends=3, stuck_after_s=STUCK_AFTER.total_seconds()
    )


@pytest.fixture
def outage_rel(db_url: str, private_redis: PrivateRedis) -> Iterator[Reliability]:
    """The database with one stuck row (delivered an hour before ``T0``, never confirmed): every round until
    it is a day old reads its lease from Redis."""
    r = reliability(db_url, private_redis.url)
    clean(r.engine)
    stuck_row(r, "stuck", T0 - dt.timedelta(hours=1), offset=4)
    yield r
    r.close()


def stuck_row(rel: Reliability, name: str, delivered: dt.datetime, offset: int) -> None:
    """A message staged and delivered at ``delivered``, never confirmed: stuck ``stuck_after`` later."""
    add_stub(rel, name, queue_offset=offset, created_at=delivered, last_sent_at=delivered)
    add_log(rel, name, delivered, queue_offset=offset)
    set_progress(rel, offset + 1)


def cron_run(db_url: str, redis_url: str, now: dt.datetime, told: list[DeadNotice]) -> RoundSummary:
    """One ``reliable sweep --once`` at ``now``: a fresh process (its gauge at 0), its e-mail channel's
    deliveries added to ``told``."""
    metrics.REDIS_UNREADABLE_SECONDS.set(0)
    rel = reliability(db_url, redis_url)
    channel = MemoryChannel("email")
    try:
        summary = Sweeper(
            rel, QueueSender(), backoff=BACKOFF, clock=Clock(now), channels=[channel]
        ).run_once()
    finally:
        rel.close()
    told.extend(channel.notices)
    return summary


def redis_notices(told: list[DeadNotice]) -> list[DeadNotice]:
    return [n for n in told if n.kind is NoticeKind.REDIS_UNREADABLE]


def test_cron_runs_say_redis_has_been_unreadable_for_longer_than_stuck_after_and_tell_a_person_once(
    outage_rel: Reliability, db_url: str, private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    url = private_redis.url
    told: list[DeadNotice] = []
    caplog.set_level(logging.INFO, logger="reliable.sweeper")
    private_redis.stop()
    for minutes in (0, 5):  # down, not yet for stuck_after: the gauge counts from the first run's failure
        summary = cron_run(db_url, url, T0 + dt.timedelta(minutes=minutes), told)
        assert summary.lease_unknown == 1, summary.line()
        assert unreadable_seconds() == minutes * 60
        assert outage_errors(caplog) == [] and told == []
    # eleven minutes of outage, over three processes: said, and a person told
    summary = cron_run(db_url, url, T0 + dt.timedelta(minutes=11), told)
    assert summary.lease_unknown == 1, summary.line()
    assert unreadable_seconds() == 11 * 60
    (error,) = outage_errors(caplog)
    assert f"since {T0.isoformat()}" in error, error
    (notice,) = redis_notices(told)
    assert T0.isoformat() in notice.reason and "stuck_after" in notice.reason, notice.reason
    assert summary.notified == 1
    # an hour on: said again each run, but told once an outage
    cron_run(db_url, url, T0 + dt.timedelta(hours=1), told)
    assert unreadable_seconds() == 3600
    assert len(outage_errors(caplog)) == 2
    assert len(redis_notices(told)) == 1
    # Redis back: the next run ends the outage, and says so
    private_redis.start()
    summary = cron_run(db_url, url, T0 + dt.timedelta(hours=1, minutes=1), told)
    assert summary.lease_unknown == 0, summary.line()
    assert unreadable_seconds() == 0
    assert any("Redis lease reads answer again" in r.getMessage() for r in caplog.records)
    # a later outage is a new one: counted from its own start, told again
    again = T0 + dt.timedelta(hours=2)
    stuck_row(outage_rel, "later", again - 2 * STUCK_AFTER, offset=6)
    private_redis.stop()
    summary = cron_run(db_url, url, again, told)
    assert summary.lease_unknown >= 1, summary.line()
    assert unreadable_seconds() == 0 and len(redis_notices(told)) == 1
    summary = cron_run(db_url, url, again + STUCK_AFTER, told)
    assert summary.lease_unknown >= 1, summary.line()
    assert unreadable_seconds() == STUCK_AFTER.total_seconds()
    assert f"since {again.isoformat()}" in outage_errors(caplog)[-1]
    first, second = redis_notices(told)
    assert again.isoformat() in second.reason and first.reason != second.reason


def test_a_long_running_sweeper_and_cron_runs_count_one_outage(
    outage_rel: Reliability, db_url: str, private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Two sweepers on one database (a long-running one and a cron line, or two hosts) agree on when the
    outage began and tell a person once between them."""
    url = private_redis.url
    told: list[DeadNotice] = []
    caplog.set_level(logging.WARNING, logger="reliable.sweeper")
    service_clock, channel = Clock(T0), MemoryChannel("email")
    service = Sweeper(outage_rel, QueueSender(), backoff=BACKOFF, clock=service_clock, channels=[channel])
    private_redis.stop()
    service.run_once()  # the long-running sweeper's read fails first, at T0
    cron_run(db_url, url, T0 + STUCK_AFTER + dt.timedelta(minutes=1), told)
    (error,) = outage_errors(caplog)
    assert f"since {T0.isoformat()}" in error, error
    assert len(redis_notices(told)) == 1
    service_clock.now = T0 + STUCK_AFTER + dt.timedelta(minutes=2)
    service.run_once()
    assert unreadable_seconds() == (STUCK_AFTER + dt.timedelta(minutes=2)).total_seconds()
    assert len(outage_errors(caplog)) == 2
    assert redis_notices(channel.notices) == []  # the "email" channel delivered it once, in the cron run


class DownChannel(MemoryChannel):
    """The e-mail channel while its mail server is down too."""

    def deliver(self, notices: Sequence[DeadNotice]) -> None:
        raise NotifyError("mail server refused the connection")


def test_a_notice_still_owed_when_redis_is_back_is_delivered_saying_it_cleared(
    outage_rel: Reliability, db_url: str, private_redis: PrivateRedis
) -> None:
    """The mail server was down too while Redis was: the notice still reaches the person, with the news."""
    url = private_redis.url
    private_redis.stop()
    for minutes in (0, 11):
        rel = reliability(db_url, url)
        now = T0 + dt.timedelta(minutes=minutes)
        Sweeper(
            rel, QueueSender(), backoff=BACKOFF, clock=Clock(now), channels=[DownChannel("email")]
        ).run_once()
        rel.close()
    with outage_rel.engine.connect() as conn:  # told: the log row, and the e-mail row still owed
        assert conn.execute(select(func.count()).select_from(StubNotification)).scalar_one() == 2
    private_redis.start()
    told: list[DeadNotice] = []
    cron_run(db_url, url, T0 + dt.timedelta(minutes=20), told)  # owed on e-mail, then cleared
    (notice,) = redis_notices(told)
    assert "Cleared at" in notice.reason, notice.reason
    # a later outage reaches the e-mail again (the cleared notice's row does not stand in for it)
    again = T0 + dt.timedelta(hours=1)
    stuck_row(outage_rel, "later", again - 2 * STUCK_AFTER, offset=6)
    private_redis.stop()
    for now in (again, again + STUCK_AFTER):
        cron_run(db_url, url, now, told)
    _, second = redis_notices(told)
    assert again.isoformat() in second.reason and "Cleared at" not in second.reason, second.reason


def test_reliable_sweep_once_from_cron_reports_an_outage_an_earlier_run_saw_begin(
    sqlite_rel: Reliability,
    sqlite_url: str,
    private_redis: PrivateRedis,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The command itself, with the real (database) clock: an earlier cron run found Redis unreadable an
    hour ago; this run's textfile for node_exporter and its log say for how long."""
    hour_ago = utcnow() - dt.timedelta(hours=1)
    staged = hour_ago - 3 * STUCK_AFTER
    add_stub(sqlite_rel, "stuck", queue_offset=4, created_at=staged, last_sent_at=staged)
    add_log(sqlite_rel, "stuck", staged, queue_offset=4)
    set_progress(sqlite_rel, 5)
    private_redis.stop()
    cron_run(sqlite_url, private_redis.url, hour_ago, [])  # the run of an hour ago
    prom = tmp_path / "reliable_sweeper.prom"
    argv = ["sweep", "--once", "--db", sqlite_url, "--sender", "tests.sweeper.senders:memory_sender"]
    argv += ["--stuck-after", "10m"]
    metrics.REDIS_UNREADABLE_SECONDS.set(0)
    with caplog.at_level(logging.WARNING, logger="reliable.sweeper"):
        assert main([*argv, "--redis", private_redis.url, "--metrics-textfile", str(prom)]) == 0
    (error,) = outage_errors(caplog)
    assert f"since {hour_ago.isoformat()}" in error, error
    (line,) = [x for x in prom.read_text().splitlines() if x.startswith("reliable_sweeper_redis_unreadable")]
    assert 3600 <= float(line.split()[1]) < 3600 + 600, line
