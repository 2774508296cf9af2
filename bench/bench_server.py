"""Server CPU per statement of the guard's new-message path on PostgreSQL (issue 18, server side).

Each statement the guard sends for a new message — the opener (inbox claim or confirm + stub settle, with the
journal row), the closer's watermark upsert — and the ceiling's single-row ``INSERT`` run ``--n`` times in a
server-side ``DO`` loop, one ``COMMIT`` per iteration, with ``synchronous_commit = off``: no client, no round
trip, no WAL flush wait, so the time per iteration is the server's own work for that statement and its
commit. The statement text is the guard's own (:mod:`reliable.stores.sql_text`), its ``?`` placeholders
filled with PL/pgSQL expressions. ``empty transaction`` is the loop and commit alone.

Prints µs per iteration, median of ``--rounds`` (every round on fresh rows; the confirm rows are staged as the
producer would). ``python -m bench server [--n 3000] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Sequence

from sqlalchemy import Connection, create_engine, text

from bench.harness import database
from reliable import Reliability
from reliable.stores import sql_text as T

NOW = "now()"


def fill(sql: str, values: Sequence[str]) -> str:
    """``sql`` with its ``?`` placeholders replaced by ``values`` in order (SQL expressions)."""
    parts = sql.split("?")
    if len(parts) != len(values) + 1:
        raise ValueError(f"{len(parts) - 1} placeholders, {len(values)} values")
    out = parts[0]
    for v, p in zip(values, parts[1:], strict=True):
        out += v + p
    return out


def log_row(group: str) -> list[str]:
    """A ``LOG_COLS`` row: the delivered queue cycles over 4 queues, the offset is the loop counter."""
    return ["m", f"'{group}'", "'bench'", "i % 4", "i", "0", NOW, "'SUCCESS'", "'w-1'", "NULL", "NULL", "''"]


def inbox_row(group: str) -> list[str]:
    """An ``INBOX_COLS`` row as the guard's claim writes it (CONFIRMED, attempts 0)."""
    return [f"'{group}'", "m", "'CONFIRMED'", "0", "'h'", NOW, NOW, "0", NOW, NOW]


def statements() -> dict[str, tuple[str, str]]:
    """name → (row prefix, statement); the prefix picks which staged rows the loop's ``m`` names."""
    claim_open = fill(T.pg_first(True), inbox_row("g2") + log_row("g2"))
    confirm = [NOW, NOW, "'g5'", "m", "'h'", "'h'"]
    settle = [NOW, NOW, "m", "'g5'"]
    confirm_open = fill(T.pg_first(False), confirm + settle + log_row("g5"))
    progress = ["'g2'", "'bench'", "''", "i % 4", "i", "i", NOW, NOW, "1"]
    return {
        "empty transaction": ("x", "PERFORM 1"),
        "ceiling: single-row INSERT": ("c", "INSERT INTO bench_ledger (message_id) VALUES (m)"),
        "journal row INSERT alone": ("l", fill(T.log_insert_bare(1), log_row("g2"))),
        "inbox claim alone (b2)": ("k", fill(T.claim_inbox(1, False, ""), inbox_row("g2"))),
        "opener, claim + journal (b2)": ("o", claim_open),
        "inbox confirm alone (b5)": ("A", fill(T.confirm_first(True), confirm)),
        "stub settle alone (b5)": ("B", fill(T.settle_stubs(1), settle)),
        "opener, confirm + settle + journal (b5)": ("C", confirm_open),
        "closer's watermark upsert": ("w", fill(T.pg_progress(1), progress)),
    }


def stage(conn: Connection, tag: str, n: int) -> None:
    """Producer rows for the confirm paths: stub + PENDING inbox row of group g5 for prefixes A, B, C."""
    mid = f"'{tag}' || s || '-' || i"
    rows = f"FROM generate_series(1, {n}) i, unnest(array['A', 'B', 'C']) s"
    conn.execute(
        text(
            "INSERT INTO message_stub (message_id, topic, content, payload_hash, status, send_count, "
            f"created_at, updated_at, broker_name) SELECT {mid}, 'bench', '\\x7b7d', 'h', 'PENDING', 1, "
            f"now(), now(), '' {rows}"
        )
    )
    conn.execute(
        text(
            "INSERT INTO message_inbox (consumer_group, message_id, status, attempts, payload_hash, "
            f"resend_count, created_at, updated_at, broker_name) SELECT 'g5', {mid}, 'PENDING', 0, 'h', 0, "
            f"now(), now(), '' {rows}"
        )
    )


def loop(conn: Connection, tag: str, prefix: str, stmt: str, n: int) -> float:
    """µs per iteration of ``stmt; COMMIT`` run ``n`` times inside the server."""
    body = f"{stmt} INTO x" if stmt.startswith("WITH") else stmt  # a query's result needs a target
    do = (
        "DO $$ DECLARE m text; x record; BEGIN FOR i IN 1.." + str(n) + " LOOP "
        f"m := '{tag}{prefix}-' || i; {body}; COMMIT; END LOOP; END $$"
    )
    t0 = time.perf_counter()
    conn.exec_driver_sql(do.replace("%", "%%"))
    return (time.perf_counter() - t0) / n * 1e6


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench server", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=3000, help="iterations per statement per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    with database("postgres") as url:
        rel = Reliability(url, None)
        rel.create_schema()
        rel.close()
        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(
                    text("CREATE TABLE bench_ledger (id serial PRIMARY KEY, message_id varchar(64))")
                )
                conn.execute(text("SET synchronous_commit = off"))
                stmts = statements()
                got: dict[str, list[float]] = {k: [] for k in stmts}
                for _ in range(args.rounds):
                    tag = uuid.uuid4().hex[:8]
                    stage(conn, tag, args.n)
                    conn.execute(text("VACUUM ANALYZE"))
                    for name, (prefix, stmt) in stmts.items():
                        got[name].append(loop(conn, tag, prefix, stmt, args.n))
        finally:
            engine.dispose()
    for name, runs in got.items():
        shown = ", ".join(f"{r:.1f}" for r in runs)
        print(f"{name:<42} {statistics.median(runs):7.1f} µs  ({shown})")
    return 0
