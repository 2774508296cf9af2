"""The broker's retry schedule as a Spark column, so the report's *stuck* is the sweeper's *stuck*.

Why: a delivery answered ``RECONSUME_LATER`` comes back from the broker after a delay that grows with its
``reconsume_times`` (RocketMQ: ``10s`` at 0 up to ``2h`` at 15, the dead-letter queue after 16). The sweeper
holds such a pair until that redelivery is due plus ``stuck_after`` (``BROKER_RETRY``, DESIGN.md §3: "not
inside the broker's own retry schedule"); a report that calls it stuck from ``stuck_after`` on raises a false
cron alert for up to two hours. The schedule is the sweeper's own object
(:class:`reliable.sweeper.verdict.RocketMQRetrySchedule`), turned into a table of delays by level once on the
driver and indexed in built-in Spark SQL (an array literal): no Python UDF, no second definition.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from reliable.sweeper.verdict import RetrySchedule, RocketMQRetrySchedule

#: how many levels of a schedule are tabulated at most (RocketMQ's ends at 16: the dead-letter queue)
MAX_LEVELS = 64


def retry_delays_s(schedule: RetrySchedule, max_levels: int = MAX_LEVELS) -> tuple[float, ...]:
    """The schedule's delay (seconds) for ``reconsume_times`` 0, 1, … up to the first level it has none for
    (the message went to the dead-letter queue: the broker will not redeliver it)."""
    delays: list[float] = []
    for level in range(max_levels):
        delay = schedule(level)
        if delay is None:
            break
        delays.append(delay.total_seconds())
    return tuple(delays)


def redelivery_due_at(
    received_at: Column, retry_level: Column, schedule: RetrySchedule | None = None
) -> Column:
    """When the broker redelivers a delivery answered with a retry at ``retry_level`` (its
    ``reconsume_times``; null: the delivery did not ask for a retry, or its outcome is unknown), or null
    when it will not (no retry asked, or past the schedule's last level: the dead-letter queue).

    A negative level counts as 0, as in the sweeper's schedule.
    """
    delays = retry_delays_s(schedule or RocketMQRetrySchedule())
    if not delays:
        return F.lit(None).cast("timestamp")
    table = F.array(*(F.lit(float(d)) for d in delays))
    level = F.when(retry_level < 0, F.lit(0)).otherwise(retry_level)  # not greatest(): it skips a null
    # CASE guards the index (ANSI mode raises on an index past the array's end)
    delay_s = F.when(level < len(delays), F.element_at(table, level + 1))
    micros = F.unix_micros(received_at) + (delay_s * F.lit(1_000_000)).cast("long")
    return F.when(delay_s.isNotNull(), F.timestamp_micros(micros))
