"""The SQL text of :mod:`reliable.stores.sql`, rendered per dialect and row count (split out for size).

Every builder returns ``?`` placeholders; :class:`reliable.stores.sql.SqlStore` converts them to the driver's
style once and caches the result per (statement, row count).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, Final

from reliable.outbox.keys import PRIMARY_KEY_HINT
from reliable.stores import JournalEntry
from reliable.types import LogOutcome

LOG_COLS = (
    "message_id, consumer_group, topic, queue_id, queue_offset, reconsume_times, received_at, outcome, "
    "worker, reason, original_topic, broker_name"
)
LOG_WIDTH = 12
#: positions of ``outcome`` and ``reason`` in a ``LOG_COLS`` row
LOG_OUTCOME = LOG_COLS.split(", ").index("outcome")
LOG_REASON = LOG_COLS.split(", ").index("reason")
#: a watermark's key: the delivered queue, with its broker group (migration 0006)
PROGRESS_KEY = "consumer_group, topic, broker_name, queue_id"
PROGRESS_COLS = f"{PROGRESS_KEY}, max_offset, min_offset, created_at, updated_at, received_count"
PROGRESS_WIDTH = 9
#: a ``message_inbox`` row the guard inserts itself (inbox pattern): status is bound (CONFIRMED, or PENDING
#: for a first handler failure), attempts and resends start at 0 or 1.
INBOX_COLS = (
    "consumer_group, message_id, status, attempts, payload_hash, first_received_at, confirmed_at, "
    "resend_count, created_at, updated_at"
)
INBOX_WIDTH = 10
_OPEN = "('PENDING', 'DEAD')"


OUTCOME_SQL = "UPDATE message_log SET outcome = ?, reason = ? WHERE id = ?"
#: whether the group dead-lettered this message at this delivered position before (the index on message id
#: and group finds the message's few rows); params: message id, group, topic, broker name, queue id, offset
DEAD_LETTER_AT_SQL = (
    "SELECT 1 FROM message_log WHERE message_id = ? AND consumer_group = ? AND topic = ? "
    "AND broker_name = ? AND queue_id = ? AND queue_offset = ? "
    f"AND outcome = '{LogOutcome.DEAD_LETTER.value}' LIMIT 1"
)
#: whether the group dead-lettered this message of this topic at any position (a delivery the broker revived
#: at a new position: RocketMQ 5.x's pop retry topic); params: message id, group, the message's topic
DEAD_LETTER_ON_TOPIC_SQL = (
    "SELECT 1 FROM message_log WHERE message_id = ? AND consumer_group = ? "
    "AND COALESCE(original_topic, topic) = ? "
    f"AND outcome = '{LogOutcome.DEAD_LETTER.value}' LIMIT 1"
)


def outcomes_case(n: int) -> str:
    """``n`` journal outcomes in one ``UPDATE``; params: (id, outcome) × n, (id, reason) × n, ids."""
    when = " ".join(["WHEN ? THEN ?"] * n)
    return (
        f"UPDATE message_log SET outcome = CASE id {when} END, reason = CASE id {when} END "
        f"WHERE id IN ({marks(n)})"
    )


def rows_sql(n: int, width: int) -> str:
    one = "(" + ", ".join("?" * width) + ")"
    return ", ".join([one] * n)


def marks(n: int) -> str:
    return ", ".join("?" * n)


def aggregate_progress(
    entries: Sequence[JournalEntry],
) -> dict[tuple[str, str, str, int], tuple[int, int, int]]:
    """Fold a batch into one watermark row per queue (an upsert may not touch the same row twice); the key
    is ``PROGRESS_KEY``'s: (group, delivered topic, broker group, queue)."""
    out: dict[tuple[str, str, str, int], tuple[int, int, int]] = {}
    for e in entries:
        key = (e.consumer_group, e.topic, e.broker_name, e.queue_id)
        cur = out.get(key)
        if cur is None:
            out[key] = (e.queue_offset, e.queue_offset, 1)
        else:
            out[key] = (max(cur[0], e.queue_offset), min(cur[1], e.queue_offset), cur[2] + 1)
    return out


def log_insert(n: int) -> str:
    """``n`` ``message_log`` rows, returning their ids (the journal of the work and failure transactions)."""
    return f"{log_insert_bare(n)} RETURNING id"


def log_insert_bare(n: int) -> str:
    return f"INSERT INTO message_log ({LOG_COLS}) VALUES {rows_sql(n, LOG_WIDTH)}"


def pg_journal(n: int, m: int) -> str:
    """``n`` log rows and ``m`` watermark rows in one statement (PostgreSQL; it may commit by itself)."""
    return f"WITH j AS ({log_insert(n)}), p AS ({pg_progress(m)}) SELECT id FROM j"


def pg_first(claim: bool) -> str:
    """The single-message happy case (claim, or confirm + stub settle) and its journal row, in one statement.

    The journal row's outcome and reason are written only if the first step changed a row. Selects (log id,
    rows changed, stubs settled). Params: the first step's, the settle's (confirm only), the log row's.
    """
    first = claim_inbox(1, False, "") if claim else confirm_first(True)
    stub = "" if claim else f", s AS ({settle_stubs(1)} AND EXISTS (SELECT 1 FROM c) RETURNING 1)"
    slots = ["?"] * LOG_WIDTH
    for i in (LOG_OUTCOME, LOG_REASON):
        slots[i] = "CASE WHEN EXISTS (SELECT 1 FROM c) THEN ? END"
    settled = "0" if claim else "(SELECT count(*) FROM s)"
    return (
        f"WITH c AS ({first} RETURNING 1){stub}, j AS (INSERT INTO message_log ({LOG_COLS}) "
        f"VALUES ({', '.join(slots)}) RETURNING id) "
        f"SELECT (SELECT id FROM j), (SELECT count(*) FROM c), {settled}"
    )


#: MariaDB: stubs are locked through the primary key, in id order, as every settle locks them. Left to
#: itself the optimizer may take the (status, resend_at) index on a small table: rows then lock in that
#: order — and every open stub is visited — so two groups settling one batch at once deadlocked. Inbox
#: rows likewise (each statement of the guard's on them names one group and its ids): through the
#: (message_id, status) index a lock read locked a row's entry there before the row, the reverse of a
#: confirm's order (the row, then the entry its status change moves), and a guard deadlocked with a guard
#: or a sweeper (reliable.outbox.keys.by_primary_key).
PK_ORDER: Final = " " + PRIMARY_KEY_HINT


def select_inbox(n: int, lock: str, hint: str = "") -> str:
    """One group's inbox rows of ``n`` ids, in id order (a fixed lock order: two batches cannot deadlock).
    ``hint``: :data:`PK_ORDER` on MariaDB, where the rows lock in the order of the index read."""
    return (
        f"SELECT message_id, status, payload_hash, attempts FROM message_inbox{hint} "
        f"WHERE consumer_group = ? AND message_id IN ({marks(n)}) ORDER BY message_id{lock}"
    )


def confirm_inbox(n: int, hint: str = "") -> str:
    """Conditional confirm of one group's PENDING/DEAD rows; params: now, now, group, *ids. An earlier
    attempt's error goes (the journal keeps it): a CONFIRMED row showing an error read as a failure.
    ``hint``: :data:`PK_ORDER` on MariaDB."""
    return (
        f"UPDATE message_inbox{hint} SET status = 'CONFIRMED', confirmed_at = ?, updated_at = ?, "
        f"last_error = NULL WHERE consumer_group = ? AND message_id IN ({marks(n)}) AND status IN {_OPEN}"
    )


def unclaim_inbox(n: int, mariadb: bool) -> str:
    """Delete one group's CONFIRMED rows of ``n`` ids (MariaDB's single-table ``DELETE`` takes no index
    hint: the multi-table form, through the primary key); params: group, *ids."""
    head = f"DELETE message_inbox FROM message_inbox{PK_ORDER}" if mariadb else "DELETE FROM message_inbox"
    return f"{head} WHERE consumer_group = ? AND message_id IN ({marks(n)}) AND status = 'CONFIRMED'"


def settle_stubs(n: int, hint: str = "") -> str:
    """Stubs of ``n`` ids whose *other* groups have all confirmed → CONFIRMED; params: now, now, *ids, group.

    The confirming group is excluded rather than read, so the statement gives the same answer before and
    after this transaction's own confirm (a sibling CTE on PostgreSQL does not see it). ``hint``:
    :data:`PK_ORDER` on MariaDB.
    """
    return (
        f"UPDATE message_stub{hint} SET status = 'CONFIRMED', confirmed_at = ?, updated_at = ?, "
        "last_error = NULL "
        f"WHERE message_id IN ({marks(n)}) AND status IN {_OPEN} AND NOT EXISTS (SELECT 1 FROM message_inbox "
        f"i WHERE i.message_id = message_stub.message_id AND i.consumer_group <> ? AND i.status IN {_OPEN})"
    )


def claim_inbox(n: int, mariadb: bool, returning: str = " RETURNING message_id") -> str:
    """Insert inbox rows unless one exists (the primary key admits one writer per group)."""
    head, tail = ("INSERT IGNORE INTO", "") if mariadb else ("INSERT INTO", " ON CONFLICT DO NOTHING")
    return f"{head} message_inbox ({INBOX_COLS}) VALUES {rows_sql(n, INBOX_WIDTH)}{tail}{returning}"


def confirm_first(pg: bool, hint: str = "") -> str:
    """Single-message happy case: confirm one group's row if PENDING (or DEAD with no failed attempt: the
    sweeper gave up on a copy that never arrived) and the body matches. A DEAD row with failures takes the
    general path, which knows ``max_attempts`` (:func:`reliable.guard.decision.judge`). ``hint``:
    :data:`PK_ORDER` on MariaDB."""
    return (
        f"UPDATE message_inbox{hint} SET status = 'CONFIRMED', confirmed_at = ?, updated_at = ?, "
        "last_error = NULL WHERE consumer_group = ? AND message_id = ? "
        "AND (status = 'PENDING' OR (status = 'DEAD' AND attempts = 0)) "
        f"AND (payload_hash IS NULL OR {'?::varchar' if pg else '?'} IS NULL OR payload_hash = ?)"
    )


def pg_confirm_record(n: int, m: int) -> str:
    """Batch confirm + stub settle + outcomes; params: confirm's, settle's, then (id, outcome, reason) × m."""
    values = ", ".join(["(?::bigint, ?::varchar, ?::text)"] * m)
    record = (
        "o AS (UPDATE message_log AS l SET outcome = v.o, reason = v.r "
        f"FROM (VALUES {values}) AS v(i, o, r) WHERE l.id = v.i)"
    )
    if n == 0:
        return f"WITH {record} SELECT 0, 0"
    return (
        f"WITH c AS ({confirm_inbox(n)} RETURNING 1), s AS ({settle_stubs(n)} RETURNING 1), "
        f"{record} SELECT (SELECT count(*) FROM c), (SELECT count(*) FROM s)"
    )


def lock_open_stubs(n: int, lock: str, hint: str = "") -> str:
    """The still-open stubs of ``n`` ids, locked in id order (the exact second step of a settle)."""
    return (
        f"SELECT message_id FROM message_stub{hint} WHERE message_id IN ({marks(n)}) AND status IN {_OPEN} "
        f"ORDER BY message_id{lock}"
    )


def upsert_failure(mariadb: bool) -> str:
    """Count one handler failure on the group's inbox row, creating it PENDING when there is none — unless
    the row is CONFIRMED: another worker applied the message while this one's handler ran (its lease ran
    out), and a failure of a message already applied is nothing to count (PostgreSQL and SQLite return no
    row then; MariaDB leaves the row as it is).

    Params: the INBOX_COLS values (status PENDING, attempts 1), then last_error and updated_at.
    """
    values = rows_sql(1, INBOX_WIDTH)
    if mariadb:
        return (
            f"INSERT INTO message_inbox ({INBOX_COLS}, last_error) VALUES {values[:-1]}, ?) "
            "ON DUPLICATE KEY UPDATE "
            "last_error = IF(status = 'CONFIRMED', last_error, VALUES(last_error)), "
            "updated_at = IF(status = 'CONFIRMED', updated_at, VALUES(updated_at)), "
            "attempts = IF(status = 'CONFIRMED', attempts, attempts + 1)"
        )
    return (
        f"INSERT INTO message_inbox ({INBOX_COLS}, last_error) VALUES {values[:-1]}, ?) "
        "ON CONFLICT (consumer_group, message_id) DO UPDATE SET attempts = message_inbox.attempts + 1, "
        "last_error = excluded.last_error, updated_at = excluded.updated_at "
        "WHERE message_inbox.status <> 'CONFIRMED' RETURNING attempts"
    )


def pg_progress(m: int) -> str:
    return (
        f"INSERT INTO consume_progress ({PROGRESS_COLS}) VALUES {rows_sql(m, PROGRESS_WIDTH)} "
        f"ON CONFLICT ({PROGRESS_KEY}) DO UPDATE SET "
        "max_offset = GREATEST(consume_progress.max_offset, EXCLUDED.max_offset), "
        "min_offset = LEAST(consume_progress.min_offset, EXCLUDED.min_offset), "
        "updated_at = EXCLUDED.updated_at, "
        "received_count = consume_progress.received_count + EXCLUDED.received_count"
    )


def sqlite_progress(m: int) -> str:
    return (
        f"INSERT INTO consume_progress ({PROGRESS_COLS}) VALUES {rows_sql(m, PROGRESS_WIDTH)} "
        f"ON CONFLICT ({PROGRESS_KEY}) DO UPDATE SET "
        "max_offset = max(max_offset, excluded.max_offset), "
        "min_offset = min(min_offset, excluded.min_offset), "
        "updated_at = excluded.updated_at, "
        "received_count = received_count + excluded.received_count"
    )


def my_progress(m: int) -> str:
    return (
        f"INSERT INTO consume_progress ({PROGRESS_COLS}) VALUES {rows_sql(m, PROGRESS_WIDTH)} "
        "ON DUPLICATE KEY UPDATE "
        "max_offset = GREATEST(max_offset, VALUES(max_offset)), "
        "min_offset = LEAST(min_offset, VALUES(min_offset)), "
        "updated_at = VALUES(updated_at), "
        "received_count = received_count + VALUES(received_count)"
    )


def ts_converter(dialect: str) -> Callable[[dt.datetime], Any]:
    """How a UTC-aware datetime is bound on ``dialect`` (mirrors :class:`reliable.models.UTCDateTime`).

    SQLite: the text SQLAlchemy's ``DateTime`` writes (``YYYY-MM-DD HH:MM:SS.ffffff``, microseconds always
    present) — ``isoformat`` writes the same as ``strftime`` at a third less cost. The guard binds one ``now``
    several times per delivery, so the last conversion is remembered (:func:`last_one`).
    """
    if dialect == "postgresql":
        return lambda t: t
    if dialect == "sqlite":
        return last_one(lambda t: t.astimezone(dt.UTC).replace(tzinfo=None).isoformat(" ", "microseconds"))
    return last_one(lambda t: t.astimezone(dt.UTC).replace(tzinfo=None))


def last_one(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``convert`` remembering its last argument (by identity) and result: a delivery binds one ``now`` 3–7
    times. Thread-safe: the (argument, result) pair is replaced as one object, and holding the argument keeps
    its identity from being reused."""
    last: list[tuple[Any, Any]] = [(_NOTHING, None)]

    def remembered(value: Any) -> Any:
        seen = last[0]
        if seen[0] is value:
            return seen[1]
        out = convert(value)
        last[0] = (value, out)
        return out

    return remembered


_NOTHING = object()
