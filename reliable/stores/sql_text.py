"""The SQL text of :mod:`reliable.stores.sql`, rendered per dialect and row count (split out for size).

Every builder returns ``?`` placeholders; :class:`reliable.stores.sql.SqlStore` converts them to the driver's
style once and caches the result per (statement, row count).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from reliable.stores import JournalEntry

LOG_COLS = (
    "message_id, consumer_group, topic, queue_id, queue_offset, reconsume_times, received_at, outcome, "
    "worker, reason"
)
PROGRESS_COLS = (
    "consumer_group, topic, queue_id, max_offset, min_offset, created_at, updated_at, received_count"
)
INBOX_COLS = (
    "message_id, topic, tags, consumer_group, content, payload_hash, status, send_count, created_at, "
    "updated_at, confirmed_at"
)


OUTCOME_SQL = "UPDATE message_log SET outcome = ?, reason = ? WHERE id = ?"


def rows_sql(n: int, width: int) -> str:
    one = "(" + ", ".join("?" * width) + ")"
    return ", ".join([one] * n)


def marks(n: int) -> str:
    return ", ".join("?" * n)


def aggregate_progress(entries: Sequence[JournalEntry]) -> dict[tuple[str, str, int], tuple[int, int, int]]:
    """Fold a batch into one watermark row per queue (an upsert may not touch the same row twice)."""
    out: dict[tuple[str, str, int], tuple[int, int, int]] = {}
    for e in entries:
        key = (e.consumer_group, e.topic, e.queue_id)
        cur = out.get(key)
        if cur is None:
            out[key] = (e.queue_offset, e.queue_offset, 1)
        else:
            out[key] = (max(cur[0], e.queue_offset), min(cur[1], e.queue_offset), cur[2] + 1)
    return out


def pg_journal(n: int, m: int, durable: bool) -> str:
    lazy = "" if durable else "s AS (SELECT set_config('synchronous_commit', 'off', true) AS v), "
    return (
        f"WITH {lazy}j AS (INSERT INTO message_log ({LOG_COLS}) VALUES {rows_sql(n, 10)} RETURNING id), "
        f"p AS (INSERT INTO consume_progress ({PROGRESS_COLS}) VALUES {rows_sql(m, 8)} "
        "ON CONFLICT (consumer_group, topic, queue_id) DO UPDATE SET "
        "max_offset = GREATEST(consume_progress.max_offset, EXCLUDED.max_offset), "
        "min_offset = LEAST(consume_progress.min_offset, EXCLUDED.min_offset), "
        "updated_at = EXCLUDED.updated_at, "
        "received_count = consume_progress.received_count + EXCLUDED.received_count) "
        + ("SELECT id FROM j" if durable else "SELECT id FROM j, s")
    )


def pg_confirm_record(n: int, m: int) -> str:
    values = ", ".join(["(?::bigint, ?::varchar, ?::text)"] * m)
    record = (
        "o AS (UPDATE message_log AS l SET outcome = v.o, reason = v.r "
        f"FROM (VALUES {values}) AS v(i, o, r) WHERE l.id = v.i)"
    )
    if n == 0:
        return f"WITH {record} SELECT 0"
    return (
        "WITH c AS (UPDATE message_stub SET status = 'CONFIRMED', confirmed_at = ?, updated_at = ? "
        f"WHERE message_id IN ({marks(n)}) AND status IN ('PENDING', 'DEAD') RETURNING 1), "
        f"{record} SELECT count(*) FROM c"
    )


def pg_progress(m: int) -> str:
    return (
        f"INSERT INTO consume_progress ({PROGRESS_COLS}) VALUES {rows_sql(m, 8)} "
        "ON CONFLICT (consumer_group, topic, queue_id) DO UPDATE SET "
        "max_offset = GREATEST(consume_progress.max_offset, EXCLUDED.max_offset), "
        "min_offset = LEAST(consume_progress.min_offset, EXCLUDED.min_offset), "
        "updated_at = EXCLUDED.updated_at, "
        "received_count = consume_progress.received_count + EXCLUDED.received_count"
    )


def sqlite_progress(m: int) -> str:
    return (
        f"INSERT INTO consume_progress ({PROGRESS_COLS}) VALUES {rows_sql(m, 8)} "
        "ON CONFLICT (consumer_group, topic, queue_id) DO UPDATE SET "
        "max_offset = max(max_offset, excluded.max_offset), "
        "min_offset = min(min_offset, excluded.min_offset), "
        "updated_at = excluded.updated_at, "
        "received_count = received_count + excluded.received_count"
    )


def my_progress(m: int) -> str:
    return (
        f"INSERT INTO consume_progress ({PROGRESS_COLS}) VALUES {rows_sql(m, 8)} "
        "ON DUPLICATE KEY UPDATE "
        "max_offset = GREATEST(max_offset, VALUES(max_offset)), "
        "min_offset = LEAST(min_offset, VALUES(min_offset)), "
        "updated_at = VALUES(updated_at), "
        "received_count = received_count + VALUES(received_count)"
    )


def ts_converter(dialect: str) -> Callable[[dt.datetime], Any]:
    """How a UTC-aware datetime is bound on ``dialect`` (mirrors :class:`reliable.models.UTCDateTime`)."""
    if dialect == "postgresql":
        return lambda t: t
    if dialect == "sqlite":
        return lambda t: t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return lambda t: t.astimezone(dt.UTC).replace(tzinfo=None)
