"""The reconciliation report in DuckDB SQL: baseline of benchmark d1 (not shipped), and its data generator.

Same definitions as ``reliable/reconcile/transforms.py`` (docs/reconcile.md), written independently in SQL,
so the benchmark also cross-checks the Spark job: both must report the same counts on the same files.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import duckdb

BASE = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
QUEUES = 16


def generate(directory: Path, stubs: int, threads: int = 2) -> dict[str, int]:
    """Write message_stub/message_log/consume_progress Parquet files with planted anomalies at known rates.

    Message ``i`` goes to queue ``i % 16`` at offset ``i // 16``. One in 1 000 is lost (pending, never
    logged), one in 1 000 stuck (pending, logged long ago), one in 2 000 dead, one in 5 000 unsent; every
    20th message is delivered twice (cause rotating: redelivery, retry, producer double-send) which brings
    the log to ~1.05 × the stubs; one log row in 100 000 is an orphan.
    """
    directory.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute(f"SET threads={threads}")
    con.execute("SET enable_progress_bar=false")
    con.execute("SET TimeZone='UTC'")
    base = BASE.strftime("%Y-%m-%d %H:%M:%S+00")
    con.execute(
        f"""
        CREATE TEMP TABLE s AS
        SELECT i,
               'm' || lpad(CAST(i AS VARCHAR), 10, '0') AS message_id,
               CASE WHEN i % 1000 = 1 THEN 'lost' WHEN i % 1000 = 2 THEN 'stuck' WHEN i % 2000 = 3 THEN 'dead'
                    WHEN i % 5000 = 4 THEN 'unsent' ELSE 'ok' END AS kind,
               TIMESTAMPTZ '{base}' + to_milliseconds(i) AS created_at
        FROM range({stubs}) t(i)
        """
    )
    con.execute(
        f"""
        COPY (
          SELECT message_id, 'orders' AS topic, NULL::VARCHAR AS tags, 'g-orders' AS consumer_group,
                 NULL::VARCHAR AS payload_hash,
                 CASE kind WHEN 'ok' THEN 'CONFIRMED' WHEN 'dead' THEN 'DEAD' ELSE 'PENDING' END AS status,
                 CASE WHEN kind = 'dead' THEN 8 WHEN i % 20 = 0 AND (i // 20) % 3 = 2 THEN 2 ELSE 1 END
                   ::INTEGER AS send_count,
                 CASE WHEN kind = 'unsent' THEN NULL ELSE (i % {QUEUES})::INTEGER END AS queue_id,
                 CASE WHEN kind = 'unsent' THEN NULL ELSE (i // {QUEUES})::BIGINT END AS queue_offset,
                 NULL::TIMESTAMPTZ AS resend_at, created_at, created_at AS updated_at,
                 created_at AS last_sent_at,
                 CASE WHEN kind = 'ok' THEN created_at + to_milliseconds(50 + i % 2000) END AS confirmed_at,
                 NULL::VARCHAR AS last_error
          FROM s ORDER BY i
        ) TO '{directory / "message_stub.parquet"}' (FORMAT parquet, COMPRESSION zstd)
        """
    )
    con.execute(
        f"""
        CREATE TEMP TABLE l AS
        SELECT message_id, i % {QUEUES} AS queue_id, i // {QUEUES} AS queue_offset, 0 AS reconsume_times,
               created_at + to_milliseconds(5 + i % 1000) AS received_at, i AS seq
        FROM s WHERE kind IN ('ok', 'stuck')
        UNION ALL
        SELECT message_id, i % {QUEUES},
               CASE (i // 20) % 3 WHEN 2 THEN 1000000000 + i // {QUEUES} ELSE i // {QUEUES} END,
               CASE (i // 20) % 3 WHEN 1 THEN 1 ELSE 0 END,
               created_at + to_milliseconds(2000 + i % 1000), i
        FROM s WHERE kind = 'ok' AND i % 20 = 0
        UNION ALL
        SELECT 'orphan-' || CAST(i AS VARCHAR), i % {QUEUES}, 2000000000 + i, 0, created_at, i
        FROM s WHERE i % 100000 = 7
        """
    )
    con.execute(
        f"""
        COPY (
          SELECT row_number() OVER (ORDER BY received_at, seq)::BIGINT AS id, message_id,
                 'g-orders' AS consumer_group, 'orders' AS topic, queue_id::INTEGER AS queue_id,
                 queue_offset::BIGINT AS queue_offset, reconsume_times::INTEGER AS reconsume_times,
                 received_at,
                 'SUCCESS' AS outcome, 'w1' AS worker, NULL::VARCHAR AS reason
          FROM l
        ) TO '{directory / "message_log.parquet"}' (FORMAT parquet, COMPRESSION zstd)
        """
    )
    con.execute(
        f"""
        COPY (
          SELECT 'g-orders' AS consumer_group, 'orders' AS topic, queue_id::INTEGER AS queue_id,
                 max(queue_offset)::BIGINT AS max_offset, min(queue_offset)::BIGINT AS min_offset,
                 min(received_at) AS created_at, max(received_at) AS updated_at,
                 count(*)::BIGINT AS received_count
          FROM l WHERE queue_offset < 1000000000 GROUP BY queue_id
        ) TO '{directory / "consume_progress.parquet"}' (FORMAT parquet)
        """
    )
    counts = {
        "stubs": int(con.execute("SELECT count(*) FROM s").fetchone()[0]),  # type: ignore[index]
        "logs": int(con.execute("SELECT count(*) FROM l").fetchone()[0]),  # type: ignore[index]
    }
    con.close()
    return counts


def reference_report(
    directory: Path, out_dir: Path, as_of: dt.datetime, grace_s: float, stuck_after_s: float, threads: int = 2
) -> dict[str, Any]:
    """Compute the report's totals and write its detail tables with DuckDB; returns totals and timing."""
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    con = duckdb.connect()
    con.execute(f"SET threads={threads}")
    con.execute("SET enable_progress_bar=false")
    con.execute("SET memory_limit='4GB'")
    con.execute("SET TimeZone='UTC'")
    con.execute("SET preserve_insertion_order=false")
    asof = as_of.strftime("%Y-%m-%d %H:%M:%S.%f+00")
    p = {t: str(directory / f"{t}.parquet") for t in ("message_stub", "message_log", "consume_progress")}
    con.execute(
        f"""
        CREATE TEMP TABLE d AS
        SELECT id, message_id, consumer_group, topic, queue_id, queue_offset, reconsume_times, received_at,
               row_number() OVER m AS delivery_no,
               count(*) OVER (PARTITION BY message_id, consumer_group) AS deliveries,
               min(received_at) OVER (PARTITION BY message_id, consumer_group) AS first_received_at,
               max(received_at) OVER (PARTITION BY message_id, consumer_group) AS last_received_at,
               row_number() OVER (PARTITION BY message_id, consumer_group, queue_id, queue_offset
                                  ORDER BY received_at, id) AS offset_no
        FROM read_parquet('{p["message_log"]}')
        WINDOW m AS (PARTITION BY message_id, consumer_group ORDER BY received_at, id)
        """
    )
    con.execute(
        f"""
        CREATE TEMP TABLE e AS
        SELECT s.message_id, s.consumer_group, s.topic AS topic, s.queue_id, s.queue_offset, s.status,
               s.send_count,
               s.created_at, s.last_sent_at, s.confirmed_at, w.max_offset AS watermark,
               coalesce(f.deliveries, 0) AS deliveries, f.first_received_at, f.last_received_at,
               coalesce(s.status = 'PENDING' AND f.deliveries IS NULL AND s.queue_offset < w.max_offset
                 AND coalesce(s.last_sent_at, s.created_at) < TIMESTAMPTZ '{asof}' - to_seconds({grace_s}),
                 false) AS is_lost,
               coalesce(s.status = 'PENDING' AND f.deliveries > 0
                 AND f.last_received_at < TIMESTAMPTZ '{asof}' - to_seconds({stuck_after_s}), false)
                 AS is_stuck,
               coalesce(s.status = 'PENDING' AND f.deliveries IS NULL AND s.queue_offset IS NULL
                 AND coalesce(s.last_sent_at, s.created_at) < TIMESTAMPTZ '{asof}' - to_seconds({grace_s}),
                 false) AS is_unsent,
               s.status = 'DEAD' AS is_dead,
               CASE WHEN f.deliveries > 0 THEN epoch_us(f.first_received_at) - epoch_us(s.created_at) END
                 / 1000.0 AS first_delivery_ms,
               CASE WHEN s.status = 'CONFIRMED' THEN epoch_us(s.confirmed_at) - epoch_us(s.created_at) END
                 / 1000.0 AS confirm_ms
        FROM read_parquet('{p["message_stub"]}') s
        LEFT JOIN (SELECT message_id, consumer_group, deliveries, first_received_at, last_received_at
                   FROM d WHERE delivery_no = 1) f USING (message_id, consumer_group)
        LEFT JOIN read_parquet('{p["consume_progress"]}') w
          ON w.consumer_group = s.consumer_group AND w.topic = s.topic AND w.queue_id = s.queue_id
        """
    )
    for name, cond in (
        ("lost", "is_lost"),
        ("stuck", "is_stuck"),
        ("dead", "is_dead"),
        ("unsent", "is_unsent"),
    ):
        con.execute(f"COPY (SELECT * FROM e WHERE {cond}) TO '{out_dir / name}.parquet' (FORMAT parquet)")
    con.execute(
        f"""
        COPY (SELECT message_id, consumer_group, topic, queue_id, queue_offset, reconsume_times, received_at,
                     id AS log_id, delivery_no, deliveries,
                     CASE WHEN offset_no = 1 THEN 'producer_double_send'
                          WHEN reconsume_times > 0 THEN 'retry' ELSE 'redelivery' END AS cause
              FROM d WHERE delivery_no > 1) TO '{out_dir / "duplicates"}.parquet' (FORMAT parquet)
        """
    )
    con.execute(
        f"""
        COPY (SELECT d.* FROM d ANTI JOIN read_parquet('{p["message_stub"]}') s USING (message_id))
        TO '{out_dir / "orphans"}.parquet' (FORMAT parquet)
        """
    )
    con.execute(
        f"""
        COPY (SELECT consumer_group, topic, queue_id, prev + 1 AS gap_start, queue_offset - 1 AS gap_end,
                     queue_offset - prev - 1 AS missing
              FROM (SELECT *, lag(queue_offset) OVER (PARTITION BY consumer_group, topic, queue_id
                                                      ORDER BY queue_offset) AS prev
                    FROM (SELECT DISTINCT consumer_group, topic, queue_id, queue_offset FROM d))
              WHERE queue_offset - prev > 1) TO '{out_dir / "gaps"}.parquet' (FORMAT parquet)
        """
    )
    per_queue = con.execute(
        """
        SELECT consumer_group, topic, queue_id, count(*) AS stubs, sum(deliveries) AS deliveries,
               count(*) FILTER (WHERE is_lost) AS lost, count(*) FILTER (WHERE is_stuck) AS stuck,
               count(*) FILTER (WHERE is_unsent) AS unsent, count(*) FILTER (WHERE is_dead) AS dead,
               max(queue_offset) AS max_stub_offset, max(watermark) AS watermark,
               approx_quantile(first_delivery_ms, [0.5, 0.95, 0.99]) AS first_delivery_pct,
               approx_quantile(confirm_ms, [0.5, 0.95, 0.99]) AS confirm_pct
        FROM e GROUP BY GROUPING SETS ((consumer_group, topic, queue_id), ())
        """
    ).fetchall()
    resend = con.execute("SELECT least(send_count, 10), count(*) FROM e GROUP BY 1").fetchall()

    def n(path: str) -> int:
        return int(con.execute(f"SELECT count(*) FROM '{out_dir / path}.parquet'").fetchone()[0])  # type: ignore[index]

    totals = {
        "lost": n("lost"),
        "stuck": n("stuck"),
        "dead": n("dead"),
        "unsent": n("unsent"),
        "duplicate_deliveries": n("duplicates"),
        "orphan_logs": n("orphans"),
        "gaps": n("gaps"),
    }
    con.close()
    return {
        "totals": totals,
        "queues": len(per_queue) - 1,
        "resend_buckets": len(resend),
        "elapsed_s": time.perf_counter() - t0,
    }
