"""*Stuck* is the sweeper's stuck: a pair whose newest delivery asked for a retry is not stuck while the
broker's redelivery of it is still due (``BROKER_RETRY``, reliable/sweeper/verdict.py), so a cron job running
``reliable reconcile --max-stuck 0`` does not page anyone for a message the broker is about to redeliver.

The scenario of the long-run hunt (issue: false stuck alarm): a handler failing downstream; the 14th delivery
(``reconsume_times`` 13) answered RECONSUME_LATER 20 minutes ago; RocketMQ redelivers it 30 minutes after
that, so the sweeper holds it until 30 min + ``stuck_after`` (15 min) after the delivery.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from tests.reconcile import dataset as D
from tests.reconcile.conftest import run_report, write_database, write_parquet

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

#: the 14th delivery's time; RocketMQ's delay for reconsume_times 13 is 30 min
NEWEST = D.ago(20)
#: from then on the sweeper re-sends it: the delivery + the broker's delay + stuck_after (15 min)
OVERDUE = NEWEST + dt.timedelta(minutes=30) + dt.timedelta(minutes=15)


def retried(last_reconsume: int = 13, outcome: str = "RETRY") -> D.Dataset:
    """One message; billing's handler failed every delivery, audit confirmed it."""
    ds = D.Dataset()
    created = ds.stub("r-1", 0, 0, status="PENDING", created=D.ago(120))
    ds.row(D.B, "r-1", "CONFIRMED", created)
    ds.log(D.B, "r-1", 0, 0, created + dt.timedelta(seconds=1))
    ds.row(D.A, "r-1", "PENDING", created)
    ds.log(D.A, "r-1", 0, 0, created + dt.timedelta(seconds=1), outcome="RETRY")
    for r in range(1, last_reconsume + 1):  # the broker's retries from %RETRY%billing, the newest 20 min ago
        received = NEWEST - dt.timedelta(minutes=last_reconsume - r)
        last = r == last_reconsume
        ds.log(
            D.A,
            "r-1",
            0,
            r - 1,
            received,
            reconsume=r,
            topic=D.retry(D.A),
            outcome=outcome if last else "RETRY",
        )
    ds.finish_progress()
    return ds


def _stuck(spark: Any, ds: D.Dataset, tmp_path: Path, as_of: dt.datetime, drop_outcome: bool = False) -> int:
    import pyarrow.parquet as pq

    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig

    src = write_parquet(ds, tmp_path / "in")
    if drop_outcome:  # an export made before the report read message_log.outcome
        log = src / "message_log.parquet"
        pq.write_table(pq.read_table(log).drop(["outcome"]), log)
    cfg = ReconcileConfig(as_of=as_of)
    summary = run_report(spark, io.read_parquet(spark, src, cfg), tmp_path / "out", cfg).summary
    return int(summary["totals"]["stuck"])


def test_a_pair_waiting_for_the_brokers_retry_is_stuck_only_once_its_redelivery_is_overdue(
    spark: Any, tmp_path: Path
) -> None:
    assert _stuck(spark, retried(), tmp_path / "now", D.AS_OF) == 0, "the broker redelivers it in 10 minutes"
    before = OVERDUE - dt.timedelta(seconds=1)
    assert _stuck(spark, retried(), tmp_path / "before", before) == 0, "the sweeper still holds it"
    after = OVERDUE + dt.timedelta(seconds=1)
    assert _stuck(spark, retried(), tmp_path / "after", after) == 1, "no redelivery came: stuck"


def test_past_the_last_retry_or_without_a_retry_the_pair_is_stuck_after_stuck_after(
    spark: Any, tmp_path: Path
) -> None:
    """reconsume_times 16 went to the dead-letter queue (no redelivery to wait for); a delivery that did not
    ask for a retry (the worker died holding it) has none either; an export without ``outcome`` keeps the
    old rule (the outcome is unknown)."""
    assert _stuck(spark, retried(last_reconsume=16), tmp_path / "dlq", D.AS_OF) == 1
    assert _stuck(spark, retried(outcome="SUCCESS"), tmp_path / "taken", D.AS_OF) == 1
    assert _stuck(spark, retried(), tmp_path / "old-export", D.AS_OF, drop_outcome=True) == 1


def _cli(*argv: str) -> argparse.Namespace:
    from reliable.cli import build_parser

    return build_parser().parse_args(["reconcile", *argv])


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_max_stuck_0_does_not_alert_on_a_pair_in_the_brokers_retry(
    backend: str, spark: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The cron job's exit code: 0 while the broker's redelivery is due, 2 once it is overdue (JDBC reads
    ``outcome`` from the database; SQLite goes through the export)."""
    from reliable.cli.reconcile import run

    url = f"sqlite:///{tmp_path / 'r.db'}" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    write_database(retried(), url)
    codes = {}
    for name, as_of in (("waiting", D.AS_OF), ("overdue", OVERDUE + dt.timedelta(minutes=1))):
        out = tmp_path / name
        args = _cli("--db", url, "--out", str(out), "--as-of", as_of.isoformat(), "--max-stuck", "0", "-q")
        codes[name] = run(args, spark=spark)
        stuck = json.loads((out / "summary.json").read_text())["attention"]["stuck"]["pairs"]
        assert stuck == ([] if name == "waiting" else [{"consumer_group": D.A, "message_id": "r-1"}])
    assert codes == {"waiting": 0, "overdue": 2}


def test_the_reports_retry_delays_are_the_sweepers(spark: Any) -> None:
    """One schedule: the report's redelivery time is the sweeper's (``RocketMQRetrySchedule``) at every
    level, null where the sweeper expects no redelivery (the dead-letter queue)."""
    from pyspark.sql import functions as F

    from reliable.reconcile.retry import redelivery_due_at
    from reliable.sweeper.verdict import RocketMQRetrySchedule

    schedule = RocketMQRetrySchedule()
    levels = [None, -1, *range(schedule.max_reconsume_times + 3)]
    df = spark.createDataFrame([(lvl, D.AS_OF) for lvl in levels], "level int, received_at timestamp")
    due = redelivery_due_at(F.col("received_at"), F.col("level"))
    delay_s = (F.unix_micros(due) - F.unix_micros(F.col("received_at"))) / F.lit(1e6)
    got = {r["level"]: r["delay_s"] for r in df.select("level", delay_s.alias("delay_s")).collect()}
    want = {}
    for level in levels:
        delay = None if level is None else schedule(level)
        want[level] = None if delay is None else delay.total_seconds()
    assert got == want
    assert want[13] == 30 * 60 and want[15] == 2 * 3600 and want[16] is None
