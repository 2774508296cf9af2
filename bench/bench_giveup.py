"""g1 — the sweeper giving a batch of rows up ÷ the same rows set DEAD by hand-written SQL.

After a long outage a sweeper can give up thousands of rows in a round, and each is a notice a person must
get soon. The record transaction that does it holds the batch's inbox rows locked, so its length is also
how long a consumer confirming one of them would wait. Ours: :func:`reliable.sweeper.giveup.mark_dead` per
batch of 500 (rows still PENDING locked, set DEAD each with its reason, stubs derived, the notice rows and
log lines written). Baseline, the least any give-up must do, in the same run on the same tables: per batch
one driver-level ``executemany`` of the inbox ``UPDATE`` plus one ``UPDATE`` of the stubs (no notices, no
lock read). Each side gives up a different group's rows of the same messages, alternating which goes first.

``python -m bench giveup --rows 5000 --runs 3 [--backends postgres,mariadb,sqlite]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import time

from sqlalchemy import bindparam, insert, text

from bench.harness import database
from reliable import Reliability
from reliable.migrate import upgrade
from reliable.models import utcnow
from reliable.sweeper import giveup
from reliable.sweeper.selection import Candidate, inbox, stub

BATCH = 500
OURS, BASE = "billing", "audit"


def _fill(rel: Reliability, run: int, rows: int, now: dt.datetime) -> list[str]:
    ids = [f"r{run}-m{i:07d}" for i in range(rows)]
    with rel.engine.begin() as conn:
        stamps = {"created_at": now, "updated_at": now}
        conn.execute(
            insert(stub),
            [
                {"message_id": m, "topic": "orders", "content": b"x", "payload_hash": "h",
                 "status": "PENDING", "send_count": 1, **stamps}
                for m in ids
            ],
        )  # fmt: skip
        conn.execute(
            insert(inbox),
            [
                {"consumer_group": g, "message_id": m, "status": "PENDING", "attempts": 0, "resend_count": 3,
                 **stamps}
                for m in ids
                for g in (OURS, BASE)
            ],
        )  # fmt: skip
    with rel.engine.begin() as conn:  # fresh tables' statistics, as a long-running database has them
        conn.exec_driver_sql(
            "ANALYZE TABLE message_inbox, message_stub" if conn.dialect.name == "mysql" else "ANALYZE"
        )
    return ids


def _ours(rel: Reliability, ids: list[str], now: dt.datetime) -> float:
    cands = [
        Candidate(OURS, m, 3, 0, i, now, now, None, None, None, topic="orders") for i, m in enumerate(ids)
    ]
    t = time.perf_counter()
    for k in range(0, len(cands), BATCH):
        with rel.engine.begin() as conn:
            told = giveup.mark_dead(
                conn, [(c, "after 4 send(s) (budget 4)") for c in cands[k : k + BATCH]], now=now
            )
            assert len(told) == len(cands[k : k + BATCH])
    return time.perf_counter() - t


def _baseline(rel: Reliability, ids: list[str], now: dt.datetime) -> float:
    mark = "?" if rel.engine.dialect.paramstyle == "qmark" else "%s"
    set_dead = (
        f"UPDATE message_inbox SET status = 'DEAD', last_error = {mark}, resend_at = NULL, "
        f"updated_at = {mark} WHERE consumer_group = {mark} AND message_id = {mark} AND status = 'PENDING'"
    )
    t = time.perf_counter()
    for k in range(0, len(ids), BATCH):
        batch = ids[k : k + BATCH]
        with rel.engine.begin() as conn:
            cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            cur.executemany(set_dead, [("DEAD: after 4 send(s)", now, BASE, m) for m in batch])
            conn.execute(_STUBS_DEAD, {"ids": batch, "now": now})
    return time.perf_counter() - t


_STUBS_DEAD = text(
    "UPDATE message_stub SET status = 'DEAD', updated_at = :now WHERE message_id IN :ids"
).bindparams(bindparam("ids", expanding=True))


def run(kind: str, rows: int, runs: int) -> list[float]:
    logging.getLogger("reliable").addHandler(
        logging.FileHandler(os.devnull)
    )  # the lines are formatted, not shown
    logging.getLogger("reliable").propagate = False
    ratios = []
    with database(kind) as url:
        rel = Reliability(url, redis_url="")
        upgrade(rel.engine)
        try:
            for r in range(runs):
                now = utcnow()
                ids = _fill(rel, r, rows, now)
                if r % 2:
                    base, ours = _baseline(rel, ids, now), _ours(rel, ids, now)
                else:
                    ours, base = _ours(rel, ids, now), _baseline(rel, ids, now)
                ratios.append(base / ours)
                print(
                    f"g1 {kind} run {r + 1}: ours {rows / ours:,.0f} rows/s ({ours:.2f} s), "
                    f"baseline {rows / base:,.0f} rows/s ({base:.2f} s), ours ÷ baseline {base / ours:.2f}"
                )
        finally:
            rel.close()
    ratios.sort()
    print(f"g1 {kind}: median ours ÷ baseline {ratios[len(ratios) // 2]:.2f} over {runs} runs of {rows} rows")
    return ratios


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench giveup", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=5000, help="rows given up per side per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--backends", default="postgres,mariadb,sqlite")
    args = ap.parse_args(argv)
    for kind in args.backends.split(","):
        run(kind.strip(), args.rows, args.runs)
    return 0
