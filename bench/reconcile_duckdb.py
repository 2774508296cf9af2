"""The reconciliation report in DuckDB SQL, per consumer group: baseline of benchmarks d1/d3 (not shipped).

Why a second implementation: d1 compares the Spark job with a single-process engine doing the *same* work,
and the benchmark's equality check is only meaningful if the definitions are the same. They are written here
independently, from docs/reconcile.md (schema_version 3: the subject is the (group, message) pair; a queue
is (group, topic, broker_name, queue_id); a pair waiting for the broker's retry is not stuck yet, by the
sweeper's own schedule), not by
translating ``reliable/reconcile/transforms.py``; the benchmark then checks both engines report the same
counts — totals, duplicates by cause and every group's figures. The percentiles here are exact nearest-rank
ones (``quantile_disc``, the ``ceil(p·n)``-th smallest; until 2026-11-28 ``approx_quantile``, whose t-digest
was far off on small inputs); the job's, read from its log-bucket sketch, are within its stated relative
error of them, which the benchmark checks against :func:`exact_percentiles`.

Only the unwindowed report (no ``--since/--until``), which is what the benchmark runs.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from pathlib import Path
from typing import Any

import duckdb

from reliable.constants import AMQP_CLOCK_POSITION_MIN as CLOCK
from reliable.reconcile.retry import retry_delays_s
from reliable.reconcile.summary import COUNTERS
from reliable.sweeper.verdict import RocketMQRetrySchedule

TABLES = ("message_stub", "message_inbox", "message_log", "consume_progress")
#: the per-group figures both engines must agree on (summary.json ``groups[]``; names from the job's summary,
#: definitions written here independently)
GROUP_COUNTS = (*COUNTERS, "lag", "never_consumed_queues")
CAUSES = ("redelivery", "retry", "producer_double_send", "targeted_resend")


def _sql_views(
    con: duckdb.DuckDBPyConnection, directory: Path, as_of: dt.datetime, grace_s: float, stuck_after_s: float
) -> None:
    for t in TABLES:
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{directory / t}.parquet')")
    inbox_columns = {r[0] for r in con.execute("DESCRIBE message_inbox").fetchall()}
    if "resend_topic" not in inbox_columns:  # exported before migration 0011: no resend's topic is known
        con.execute("DROP VIEW message_inbox")
        con.execute(
            "CREATE VIEW message_inbox AS SELECT *, CAST(NULL AS VARCHAR) AS resend_topic"
            f" FROM read_parquet('{directory / 'message_inbox'}.parquet')"
        )
    now = as_of.strftime("%Y-%m-%d %H:%M:%S.%f+00")
    # the sweeper's retry schedule (its own object, not a copy of its table): delay by reconsume_times
    delays = "[" + ", ".join(str(float(d)) for d in retry_delays_s(RocketMQRetrySchedule())) + "]"
    # d: every delivery, numbered per pair and per (pair, delivered position)
    con.execute(
        """
        CREATE TEMP TABLE d AS
        SELECT id, message_id, consumer_group, topic, broker_name, queue_id, queue_offset,
                     coalesce(reconsume_times, 0) AS reconsume_times, received_at,
                     row_number() OVER (PARTITION BY message_id, consumer_group ORDER BY received_at, id)
                       AS delivery_no,
                     count(*) OVER (PARTITION BY message_id, consumer_group) AS deliveries,
                     min(received_at) OVER (PARTITION BY message_id, consumer_group) AS first_received_at,
                     max(received_at) OVER (PARTITION BY message_id, consumer_group) AS last_received_at,
                     -- the newest delivery's reconsume_times when it was answered with a retry
                     last_value(CASE WHEN upper(outcome) = 'RETRY' THEN coalesce(reconsume_times, 0) END)
                       OVER (PARTITION BY message_id, consumer_group ORDER BY received_at, id
                             ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS last_retry_level,
                     row_number() OVER (PARTITION BY message_id, consumer_group, topic, broker_name, queue_id,
                                                     queue_offset ORDER BY received_at, id) AS position_no
        FROM message_log
        """
    )
    # e: the (group, message) pairs with their last send, watermarks, flags and latencies
    con.execute(
        f"""
        CREATE TEMP TABLE e AS
        WITH pr AS (
          SELECT i.consumer_group, i.message_id, upper(i.status) AS status, s.topic, s.broker_name,
                 s.queue_id, s.queue_offset, s.created_at, s.last_sent_at, i.confirmed_at,
                 coalesce(i.resend_count, 0) > 0 AND i.queue_offset IS NOT NULL AS targeted,
                 i.broker_name AS r_broker_name, i.queue_id AS r_queue_id, i.queue_offset AS r_queue_offset,
                 i.resend_topic AS r_topic
          FROM message_inbox i JOIN message_stub s USING (message_id)
        ), sent AS (
          SELECT *,
                 -- a targeted resend is where its row says it landed; recorded before migration 0011:
                 -- in the group's %RETRY% topic (what the report assumed then)
                 CASE WHEN targeted THEN coalesce(r_topic, '%RETRY%' || consumer_group) ELSE topic END
                   AS send_topic,
                 CASE WHEN targeted THEN r_broker_name ELSE broker_name END AS send_broker_name,
                 CASE WHEN targeted THEN r_queue_id ELSE queue_id END AS send_queue_id,
                 CASE WHEN targeted THEN r_queue_offset ELSE queue_offset END AS send_offset
          FROM pr
        )
        SELECT x.consumer_group, x.message_id, x.status, x.topic, x.broker_name, x.queue_id, x.queue_offset,
               w.max_offset AS watermark, coalesce(f.deliveries, 0) AS deliveries,
               x.status = 'PENDING' AND f.deliveries IS NULL AND x.send_offset IS NOT NULL
                 AND coalesce(x.send_offset <= sw.max_offset, false)
                 AND coalesce(x.last_sent_at, x.created_at) < TIMESTAMPTZ '{now}' - to_seconds({grace_s})
                 AS is_lost,
               x.status = 'PENDING' AND f.deliveries IS NOT NULL
                 AND f.last_received_at < TIMESTAMPTZ '{now}' - to_seconds({stuck_after_s})
                 -- answered with a retry: stuck once the broker's redelivery is stuck_after old too
                 AND coalesce(f.last_received_at + to_seconds(
                       CASE WHEN f.last_retry_level < {len(delays)}
                            THEN {delays}[greatest(f.last_retry_level, 0) + 1] END)
                       <= TIMESTAMPTZ '{now}' - to_seconds({stuck_after_s}), true) AS is_stuck,
               x.status = 'PENDING' AND f.deliveries IS NULL AND x.send_offset IS NULL
                 AND coalesce(x.last_sent_at, x.created_at) < TIMESTAMPTZ '{now}' - to_seconds({grace_s})
                 AS is_unsent,
               x.status IN ('PENDING', 'DEAD') AND x.queue_id IS NOT NULL AND w.max_offset IS NULL
                 AND NOT coalesce((x.broker_name <> '' AND q.unnamed_wm IS NOT NULL)
                                  OR (x.broker_name = '' AND q.seen), false) AS is_never_consumed,
               CASE WHEN w.max_offset IS NULL AND x.broker_name <> '' THEN q.unnamed_wm
                    ELSE w.max_offset END AS lag_watermark,
               CASE WHEN f.deliveries IS NOT NULL
                    THEN (epoch_us(f.first_received_at) - epoch_us(x.created_at)) / 1000.0 END
                 AS first_delivery_ms,
               CASE WHEN x.status = 'CONFIRMED' AND x.confirmed_at IS NOT NULL
                    THEN (epoch_us(x.confirmed_at) - epoch_us(x.created_at)) / 1000.0 END AS confirm_ms
        FROM sent x
        LEFT JOIN (SELECT * FROM d WHERE delivery_no = 1) f USING (message_id, consumer_group)
        LEFT JOIN consume_progress w
          ON w.consumer_group = x.consumer_group AND w.topic = x.topic AND w.broker_name = x.broker_name
         AND w.queue_id = x.queue_id
        LEFT JOIN consume_progress sw
          ON sw.consumer_group = x.consumer_group AND sw.topic = x.send_topic
         AND sw.broker_name = x.send_broker_name AND sw.queue_id = x.send_queue_id
        LEFT JOIN (SELECT consumer_group, topic, queue_id, true AS seen,
                          max(max_offset) FILTER (WHERE broker_name = '') AS unnamed_wm
                   FROM consume_progress GROUP BY ALL) q
          ON q.consumer_group = x.consumer_group AND q.topic = x.topic AND q.queue_id = x.queue_id
        """
    )
    # dup: the extra deliveries of the pairs (a message without a stub is an orphan, not a duplicate), each
    # with its cause; a *targeted copy* is one in the group's %RETRY% topic, or at a position some group's
    # inbox row records as its last targeted send, on the topic it records (none: the message's topic)
    con.execute(
        """
        CREATE TEMP TABLE dup AS
        WITH resent AS (
          SELECT message_id,
                 bool_or(resend_count >= 2 OR queue_offset IS NULL) AS unrecorded_resends
          FROM message_inbox WHERE resend_count > 0 GROUP BY message_id
        ), k AS (
          SELECT d.*, s.send_count, coalesce(r.unrecorded_resends, false) AS unrecorded_resends,
                 d.reconsume_times = 0 AND (
                   d.topic = '%RETRY%' || d.consumer_group
                   -- on the topic the row records; recorded before migration 0011: the message's
                   OR EXISTS (
                         SELECT 1 FROM message_inbox i
                         WHERE i.message_id = d.message_id AND i.resend_count > 0
                           AND coalesce(i.resend_topic, s.topic) = d.topic
                           AND coalesce(i.broker_name, '') = coalesce(d.broker_name, '')
                           AND i.queue_id = d.queue_id AND i.queue_offset = d.queue_offset)) AS targeted_copy
          FROM d JOIN message_stub s USING (message_id) LEFT JOIN resent r USING (message_id)
          SEMI JOIN e USING (message_id, consumer_group)
        ), w AS (
          SELECT *, coalesce(bool_or(targeted_copy) OVER (PARTITION BY message_id, consumer_group
                                                         ORDER BY received_at, id ROWS BETWEEN UNBOUNDED
                                                         PRECEDING AND 1 PRECEDING), false) AS after_targeted
          FROM k
        )
        SELECT * EXCLUDE (send_count, unrecorded_resends, targeted_copy, after_targeted),
               CASE WHEN reconsume_times > 0 THEN 'retry'
                    WHEN position_no > 1 THEN 'redelivery'
                    WHEN targeted_copy OR after_targeted THEN 'targeted_resend'
                    WHEN unrecorded_resends AND coalesce(send_count, 1) <= 1 THEN 'targeted_resend'
                    ELSE 'producer_double_send' END AS cause
        FROM w WHERE delivery_no > 1
        """
    )


def _detail_tables(con: duckdb.DuckDBPyConnection, out_dir: Path) -> None:
    """The detail tables the job writes, so both engines do the same amount of output work."""
    for name in ("lost", "stuck", "unsent"):
        con.execute(f"COPY (SELECT * FROM e WHERE is_{name}) TO '{out_dir / name}.parquet' (FORMAT parquet)")
    con.execute(
        f"COPY (SELECT * FROM e WHERE status = 'DEAD') TO '{out_dir / 'dead'}.parquet' (FORMAT parquet)"
    )
    con.execute(f"COPY (SELECT * FROM dup) TO '{out_dir / 'duplicates'}.parquet' (FORMAT parquet)")
    con.execute(
        f"""
        CREATE TEMP TABLE o AS SELECT d.* FROM d ANTI JOIN message_stub s USING (message_id);
        COPY o TO '{out_dir / "orphans"}.parquet' (FORMAT parquet);
        CREATE TEMP TABLE gp AS
        SELECT consumer_group, topic, broker_name, queue_id, prev + 1 AS gap_start,
               queue_offset - 1 AS gap_end, queue_offset - prev - 1 AS missing
        FROM (SELECT *, lag(queue_offset) OVER (PARTITION BY consumer_group, topic, broker_name, queue_id
                                                ORDER BY queue_offset) AS prev
              -- a RabbitMQ sender's clock (µs) is no offset: RabbitMQ queues have no gaps
              FROM (SELECT DISTINCT consumer_group, topic, broker_name, queue_id, queue_offset FROM d
                    WHERE queue_offset < {CLOCK}))
        WHERE queue_offset - prev > 1;
        COPY gp TO '{out_dir / "gaps"}.parquet' (FORMAT parquet);
        """
    )


def _groups(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Any]]:
    """Every group's figures, each computed from its own table (no reuse of the per-queue sums)."""
    out: dict[str, dict[str, Any]] = {}

    def put(sql: str) -> None:
        cur = con.execute(sql)
        names = [c[0] for c in cur.description or ()]
        for row in cur.fetchall():
            g = out.setdefault(
                str(row[0]), {**dict.fromkeys(GROUP_COUNTS, 0), "by_cause": dict.fromkeys(CAUSES, 0)}
            )
            for name, value in zip(names[1:], row[1:], strict=True):
                g[name] = int(value or 0)

    put(
        """
        SELECT consumer_group, count(*) AS inbox_rows,
               count(*) FILTER (WHERE status = 'PENDING') AS pending,
               count(*) FILTER (WHERE status = 'CONFIRMED') AS confirmed,
               count(*) FILTER (WHERE status = 'VOIDED') AS voided,
               count(*) FILTER (WHERE status = 'DEAD') AS dead,
               count(*) FILTER (WHERE is_lost) AS lost, count(*) FILTER (WHERE is_stuck) AS stuck,
               count(*) FILTER (WHERE is_unsent) AS unsent, sum(deliveries) AS deliveries
        FROM e GROUP BY 1
        """
    )
    put("SELECT consumer_group, count(*) AS duplicate_deliveries FROM dup GROUP BY 1")
    put("SELECT consumer_group, count(*) AS orphan_logs FROM o GROUP BY 1")
    put("SELECT consumer_group, count(*) AS gaps, sum(missing) AS missing_offsets FROM gp GROUP BY 1")
    put(
        f"""
        SELECT consumer_group,
               -- a queue whose positions are its RabbitMQ senders' clock (µs) has no lag
               sum(CASE WHEN owed AND top < {CLOCK} AND coalesce(watermark, -1) < {CLOCK}
                        THEN greatest(0, top - coalesce(watermark, -1)) ELSE 0 END) AS lag,
               count(*) FILTER (WHERE never) AS never_consumed_queues
        FROM (SELECT consumer_group, topic, broker_name, queue_id, max(queue_offset) AS top,
                     max(lag_watermark) AS watermark, bool_or(status <> 'VOIDED') AS owed,
                     bool_or(is_never_consumed) AS never
              FROM e WHERE queue_id IS NOT NULL GROUP BY ALL)
        GROUP BY 1
        """
    )
    for group, cause, n in con.execute(
        "SELECT consumer_group, cause, count(*) FROM dup GROUP BY ALL"
    ).fetchall():
        out[str(group)]["by_cause"][str(cause)] = int(n)
    return dict(sorted(out.items()))


def reference_report(
    directory: Path, out_dir: Path, as_of: dt.datetime, grace_s: float, stuck_after_s: float, threads: int = 2
) -> dict[str, Any]:
    """Compute the report and write its detail tables with DuckDB; returns totals, groups and percentiles."""
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    con = duckdb.connect()
    for setting in (
        "threads=" + str(threads),
        "enable_progress_bar=false",
        "memory_limit='4GB'",
        "TimeZone='UTC'",
        "preserve_insertion_order=false",
    ):
        con.execute(f"SET {setting}")
    _sql_views(con, directory, as_of, grace_s, stuck_after_s)
    _detail_tables(con, out_dir)
    groups = _groups(con)
    row = con.execute(
        """
        SELECT (SELECT count(*) FROM message_stub),
               (SELECT count(DISTINCT (consumer_group, message_id)) FROM dup),
               quantile_disc(first_delivery_ms, [0.5, 0.95, 0.99]),
               quantile_disc(confirm_ms, [0.5, 0.95, 0.99])
        FROM e
        """
    ).fetchone()
    con.close()
    assert row is not None
    totals: dict[str, int] = {"messages": int(row[0])}
    totals.update({k: sum(g[k] for g in groups.values()) for k in GROUP_COUNTS})
    totals["duplicate_pairs"] = int(row[1])
    by_cause = {c: sum(g["by_cause"][c] for g in groups.values()) for c in CAUSES}
    return {
        "totals": totals,
        "duplicates_by_cause": by_cause,
        "groups": groups,
        "percentiles_ms": {"send_to_first_delivery": row[2], "send_to_confirm": row[3]},
        "elapsed_s": time.perf_counter() - t0,
    }


def exact_percentiles(directory: Path, ps: tuple[float, ...] = (0.5, 0.95, 0.99)) -> dict[str, list[float]]:
    """The exact nearest-rank percentiles (the ``ceil(p·n)``-th smallest) of both latencies, over all pairs.

    Not part of the timed report (it sorts every latency): the benchmark checks the job's percentiles
    against these within the job's stated relative error.
    """
    con = duckdb.connect()
    con.execute("SET threads=2")
    con.execute("SET TimeZone='UTC'")
    for t in TABLES:
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{directory / t}.parquet')")
    metrics = {
        # the pair's first delivery to its group; pairs never delivered have no sample
        "send_to_first_delivery": """
            SELECT (epoch_us(min(l.received_at)) - epoch_us(any_value(s.created_at))) / 1000.0 AS x
            FROM message_inbox i JOIN message_stub s USING (message_id)
            JOIN message_log l ON l.message_id = i.message_id AND l.consumer_group = i.consumer_group
            GROUP BY i.consumer_group, i.message_id""",
        "send_to_confirm": """
            SELECT (epoch_us(i.confirmed_at) - epoch_us(s.created_at)) / 1000.0 AS x
            FROM message_inbox i JOIN message_stub s USING (message_id)
            WHERE upper(i.status) = 'CONFIRMED' AND i.confirmed_at IS NOT NULL""",
    }
    out: dict[str, list[float]] = {}
    for name, sql in metrics.items():
        ranks = ", ".join(f"ceil({p} * n)" for p in ps)
        rows = con.execute(
            f"""
            SELECT rn, x FROM (SELECT x, row_number() OVER (ORDER BY x) AS rn, count(*) OVER () AS n
                               FROM ({sql}) WHERE x IS NOT NULL)
            WHERE rn IN ({ranks}) ORDER BY rn
            """
        ).fetchall()
        n = con.execute(f"SELECT count(x) FROM ({sql})").fetchone()
        assert n is not None
        by_rank = {int(r): float(x) for r, x in rows}
        out[name] = [by_rank[max(1, math.ceil(p * int(n[0])))] for p in ps]
    con.close()
    return out


def spark_view(summary: dict[str, Any]) -> dict[str, Any]:
    """The same figures out of a ``summary.json`` (schema_version 3), for the equality check."""
    groups = {
        g["consumer_group"]: {
            **{k: int(g[k]) for k in GROUP_COUNTS},
            "by_cause": dict(g["duplicates_by_cause"]),
        }
        for g in summary["groups"]
    }
    totals = {k: int(summary["totals"][k]) for k in ("messages", *GROUP_COUNTS, "duplicate_pairs")}
    lat = summary["latency_ms"]
    return {
        "totals": totals,
        "duplicates_by_cause": dict(summary["duplicates_by_cause"]),
        "groups": dict(sorted(groups.items())),
        "percentiles_ms": {k: [lat[k]["p50"], lat[k]["p95"], lat[k]["p99"]] for k in lat},
    }
