"""The data set of benchmark d1/d3: the four contract tables as Parquet, with a consumer-group fan-out.

Why generated and not recorded: the anomaly rates must be known, so the report's counts can be checked by
two engines, and the size must scale (1 M, 3 M, 10 M messages) with the same shape.

Shape for ``messages`` = N (one ``message_stub`` row each; "3 M stubs" means N = 3 000 000):

* topics ``orders`` (even ``i``) and ``payments`` (odd ``i``), 8 queues each; message ``i`` is at queue
  ``(i // 2) % 8``, offset ``(i // 2) // 8`` of its topic;
* **two consumer groups per topic** (``orders``: billing, audit; ``payments``: ledger, search), so
  ``message_inbox`` has 2 N rows (the report's subject, the (group, message) pairs) and ``message_log``
  about 2.1 N;
* per pair (``g`` = 0 for the first group, 1 for the second; rates counted on ``i // 2`` so both topics
  get them): lost for group 0 one message in 1 000
  (pending, never delivered, below the watermark), stuck for group 1 one in 1 000 (delivered a day before
  ``as_of``, never confirmed), and for group 1 three in 1 000 whose newest delivery was answered with a
  retry (``outcome`` RETRY; the earlier deliveries of their retries are left out): ``reconsume_times`` 13
  20 min before ``as_of`` (the broker redelivers after 30 min: waiting for it, *not* stuck), 13 50 min
  before (its redelivery is past due: stuck) and 16 20 min before (past the last retry, the dead-letter
  queue: stuck); dead for group 0 one in 2 000, voided for group 1 one in 3 000, unsent for both
  one message in 5 000 (no queue); every 10th message is delivered twice to each group with the cause
  rotating — redelivery, retry (via ``%RETRY%{group}``), producer double send (second copy in the topic),
  targeted resend (group 0 only, via ``%RETRY%{group}``, recorded in its inbox row);
* one orphan delivery (no stub) per 100 000 messages; ``consume_progress`` is each delivered queue's highest
  offset below the double-send copies, except that ``audit`` lags 1 000 offsets on ``orders`` queue 3 and
  ``search`` never consumed ``payments`` queue 7 (the never-consumed alarm).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb

BASE = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
#: the generated inputs are cached under this name (bump it when the data set's shape changes): v3 added
#: the deliveries answered with a retry
VERSION = "v3"
QUEUES = 8
#: offsets of the producer's second copies start here (above any first-copy offset of the data set)
DOUBLE_SEND_BASE = 1_000_000_000


def as_of(messages: int) -> dt.datetime:
    """The report's 'now' for a data set: one day after its last message (so every stuck pair is stuck)."""
    return BASE + dt.timedelta(milliseconds=messages) + dt.timedelta(days=1)


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    row = con.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def generate(directory: Path, messages: int, threads: int = 2) -> dict[str, int]:
    """Write the four tables into ``directory`` (``<table>.parquet``); returns the row counts."""
    directory.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute(f"SET threads={threads}")
    con.execute("SET enable_progress_bar=false")
    con.execute("SET TimeZone='UTC'")
    base = BASE.strftime("%Y-%m-%d %H:%M:%S+00")
    now = as_of(messages).strftime("%Y-%m-%d %H:%M:%S.%f+00")
    con.execute(
        f"""
        CREATE TEMP TABLE s AS
        SELECT i, 'm' || lpad(CAST(i AS VARCHAR), 10, '0') AS message_id,
               CASE WHEN i % 2 = 0 THEN 'orders' ELSE 'payments' END AS topic,
               (i // 2) % 5000 = 4 AS unsent,
               -- dup: 0 redelivery, 1 retry, 2 producer double send, 3 targeted resend
               CASE WHEN (i // 2) % 10 = 0 THEN (i // 20) % 4 END AS dup,
               (i // 2) % {QUEUES} AS q, (i // 2) // {QUEUES} AS off,
               TIMESTAMPTZ '{base}' + to_milliseconds(i) AS created_at
        FROM range({messages}) t(i)
        """
    )
    con.execute(
        """
        CREATE TEMP TABLE p AS
        SELECT s.*, g,
               CASE WHEN topic = 'orders' THEN (CASE g WHEN 0 THEN 'billing' ELSE 'audit' END)
                    ELSE (CASE g WHEN 0 THEN 'ledger' ELSE 'search' END) END AS grp,
               CASE WHEN unsent THEN 'unsent' WHEN g = 0 AND (i // 2) % 1000 = 1 THEN 'lost'
                    WHEN g = 1 AND (i // 2) % 1000 = 2 THEN 'stuck'
                    WHEN g = 1 AND (i // 2) % 1000 = 6 THEN 'retry_waiting'
                    WHEN g = 1 AND (i // 2) % 1000 = 7 THEN 'retry_due'
                    WHEN g = 1 AND (i // 2) % 1000 = 8 THEN 'retry_dead_lettered'
                    WHEN g = 0 AND (i // 2) % 2000 = 3 THEN 'dead'
                    WHEN g = 1 AND (i // 2) % 3000 = 5 THEN 'voided' ELSE 'ok' END AS kind
        FROM s, range(2) t(g)
        """
    )
    con.execute(
        f"""
        COPY (SELECT message_id, topic,
                     CASE WHEN unsent OR (i // 2) % 1000 IN (1, 2, 6, 7, 8) THEN 'PENDING'
                          WHEN (i // 2) % 2000 = 3 THEN 'DEAD'
                          ELSE 'CONFIRMED' END AS status,
                     CASE WHEN dup = 2 THEN 2 ELSE 1 END::INTEGER AS send_count,
                     CASE WHEN unsent THEN NULL ELSE q END::INTEGER AS queue_id,
                     CASE WHEN unsent THEN NULL ELSE off END::BIGINT AS queue_offset,
                     created_at, created_at AS updated_at,
                     CASE WHEN NOT unsent THEN created_at END AS last_sent_at, '' AS broker_name
              FROM s ORDER BY i)
        TO '{directory / "message_stub.parquet"}' (FORMAT parquet, COMPRESSION zstd)
        """
    )
    targeted = "p.kind = 'ok' AND p.dup = 3 AND p.g = 0"
    con.execute(
        f"""
        COPY (SELECT grp AS consumer_group, message_id,
                     CASE kind WHEN 'ok' THEN 'CONFIRMED' WHEN 'dead' THEN 'DEAD' WHEN 'voided' THEN 'VOIDED'
                          ELSE 'PENDING' END AS status,
                     CASE WHEN kind = 'dead' THEN 16 WHEN kind = 'stuck' THEN 1
                          WHEN starts_with(kind, 'retry_') THEN 14 ELSE 0 END::INTEGER AS attempts,
                     CASE WHEN {targeted} THEN 1 ELSE 0 END::INTEGER AS resend_count,
                     CASE WHEN {targeted} THEN 0 END::INTEGER AS queue_id,
                     CASE WHEN {targeted} THEN i // 20 END::BIGINT AS queue_offset,
                     CASE WHEN {targeted} THEN '%RETRY%' || grp END AS resend_topic,
                     CASE WHEN kind = 'ok' THEN created_at + to_milliseconds(50 + i % 2000 + g) END
                       AS confirmed_at, '' AS broker_name
              FROM p ORDER BY i, g)
        TO '{directory / "message_inbox.parquet"}' (FORMAT parquet, COMPRESSION zstd)
        """
    )
    con.execute(
        f"""
        CREATE TEMP TABLE l AS
        SELECT message_id, grp, topic AS dtopic, topic, q AS queue_id, off AS queue_offset,
               0 AS reconsume_times, created_at + to_milliseconds(5 + i % 1000) AS received_at, i, g,
               'SUCCESS' AS outcome
        FROM p WHERE kind IN ('ok', 'stuck', 'dead', 'voided')
        UNION ALL
        SELECT message_id, grp, topic, topic, q, off,
               CASE kind WHEN 'retry_dead_lettered' THEN 16 ELSE 13 END,
               TIMESTAMPTZ '{now}' - to_minutes(CASE kind WHEN 'retry_due' THEN 50 ELSE 20 END), i, g, 'RETRY'
        FROM p WHERE starts_with(kind, 'retry_')
        UNION ALL
        SELECT message_id, grp,
               CASE WHEN dup IN (1, 3) THEN '%RETRY%' || grp ELSE topic END, topic,
               CASE WHEN dup IN (1, 3) THEN 0 ELSE q END,
               CASE dup WHEN 0 THEN off WHEN 2 THEN {DOUBLE_SEND_BASE} + off ELSE i // 20 END,
               CASE WHEN dup = 1 THEN 1 ELSE 0 END,
               created_at + to_milliseconds(2000 + i % 1000), i, g, 'SUCCESS'
        FROM p WHERE kind = 'ok' AND dup IS NOT NULL AND (dup <> 3 OR g = 0)
        UNION ALL
        SELECT 'orphan-' || CAST(i AS VARCHAR), grp, topic, topic, q, 2 * {DOUBLE_SEND_BASE} + i, 0,
               created_at, i, g, 'SUCCESS'
        FROM p WHERE i % 100000 = 7 AND g = 0
        """
    )
    con.execute(
        f"""
        COPY (SELECT row_number() OVER (ORDER BY received_at, i, g, dtopic)::BIGINT AS id, message_id,
                     grp AS consumer_group, dtopic AS topic, topic AS original_topic,
                     queue_id::INTEGER AS queue_id, queue_offset::BIGINT AS queue_offset,
                     reconsume_times::INTEGER AS reconsume_times, received_at,
                     outcome, 'w1' AS worker, NULL::VARCHAR AS reason, '' AS broker_name
              FROM l ORDER BY id)
        TO '{directory / "message_log.parquet"}' (FORMAT parquet, COMPRESSION zstd)
        """
    )
    con.execute(
        f"""
        COPY (SELECT grp AS consumer_group, dtopic AS topic, queue_id::INTEGER AS queue_id,
                     (max(queue_offset) - CASE WHEN grp = 'audit' AND dtopic = 'orders' AND queue_id = 3
                                               THEN 1000 ELSE 0 END)::BIGINT AS max_offset,
                     min(received_at) AS created_at, max(received_at) AS updated_at, '' AS broker_name
              FROM l WHERE queue_offset < {DOUBLE_SEND_BASE}
                 AND NOT (grp = 'search' AND dtopic = 'payments' AND queue_id = 7)
              GROUP BY grp, dtopic, queue_id)
        TO '{directory / "consume_progress.parquet"}' (FORMAT parquet)
        """
    )
    counts = {
        "messages": _one(con, "SELECT count(*) FROM s"),
        "inbox_rows": _one(con, "SELECT count(*) FROM p"),
        "logs": _one(con, "SELECT count(*) FROM l"),
    }
    con.close()
    return counts
