"""Running rounds on a schedule: APScheduler 3.x ``BlockingScheduler`` with a cron or interval trigger.

* ``max_instances=1`` and ``coalesce=True``: a round that outlasts its interval is never joined by a
  second one; the missed runs collapse into one run after it.
* SIGTERM / SIGINT: the scheduler stops taking new runs, the sweeper is asked to stop after its current
  send, and :func:`run_scheduled` returns once the round in flight has finished (so systemd's stop or
  Kubernetes' termination never cuts a batch between "sent" and "recorded" unless the grace period ends).
* ``misfire_grace_time=None``: a run that is late (the machine was suspended, a round ran long) still runs.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from reliable.sweeper.backoff import parse_duration
from reliable.sweeper.errors import SweeperConfigError
from reliable.sweeper.sweeper import Sweeper

log = logging.getLogger("reliable.sweeper")


def make_trigger(cron: str | None = None, interval: str | None = None) -> Any:
    """A ``CronTrigger`` from a 5-field crontab line (UTC) or an ``IntervalTrigger`` from ``30s``/``5m``."""
    if (cron is None) == (interval is None):
        raise SweeperConfigError("give exactly one of a cron expression or an interval")
    if cron is not None:
        try:
            return CronTrigger.from_crontab(cron, timezone="UTC")
        except ValueError as exc:
            raise SweeperConfigError(f"bad cron expression {cron!r}: {exc}") from None
    assert interval is not None
    seconds = parse_duration(interval)
    if seconds <= 0:
        raise SweeperConfigError("interval must be > 0")
    return IntervalTrigger(seconds=seconds, timezone="UTC")


def run_scheduled(
    sweeper: Sweeper, trigger: Any, *, run_now: bool = False, handle_signals: bool = True
) -> int:
    """Run ``sweeper.run_once`` on ``trigger`` until SIGTERM/SIGINT; returns the exit code (0).

    A failing round is logged (with its traceback, by ``run_once``) and the schedule goes on: a database
    that is down for a minute must not end a long-running sweeper.
    """
    scheduler = BlockingScheduler(timezone="UTC")
    in_round = threading.Lock()

    def job() -> None:
        with in_round:  # belt and braces next to max_instances=1
            if sweeper.stopping:
                return
            try:
                sweeper.run_once()
            except Exception:  # run_once logged it and counted it; the next round tries again
                log.warning("sweeper: round failed; next round as scheduled")

    kwargs: dict[str, Any] = {
        "max_instances": 1,
        "coalesce": True,
        "misfire_grace_time": None,
        "id": "reliable-sweep",
    }
    if run_now:
        from datetime import UTC, datetime

        kwargs["next_run_time"] = datetime.now(UTC)
    scheduler.add_job(job, trigger, **kwargs)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("sweeper: %s received, stopping after the current round", signal.Signals(signum).name)
        sweeper.stop()
        scheduler.shutdown(wait=False)

    previous: dict[signal.Signals, Any] = {}
    if handle_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    log.info("sweeper: scheduled with %s", trigger)
    try:
        scheduler.start()  # returns after shutdown()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    with in_round:  # wait for the round in flight
        pass
    log.info("sweeper: stopped")
    return 0
