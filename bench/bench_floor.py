"""The floor: what the guard's round trips cost with no framework around them (issue 18, items 1 and 4).

b2 compares the guard with AWS Powertools and b5 with one ``INSERT`` + ``COMMIT`` per message. Neither says
how much of the guard's time is its wire work — the round trips and rows its guarantees need — and how much
is the Python around it. This bench sends exactly the guard's traffic for one new message from a bare loop:

* Redis: ``SET key processing:… NX PX … GET``, the previous message's ``done`` marker packed in front of it
  (one write, one wait), on a raw socket;
* PostgreSQL, through :func:`reliable.stores.pg_pipeline.run` on a plain psycopg connection: ``BEGIN`` + the
  guard's own opener text (:func:`reliable.stores.sql_text.pg_first`: inbox claim, or confirm + stub settle,
  with the journal row) in one round trip, the handler's ``INSERT``, the guard's watermark upsert +
  ``COMMIT`` in one round trip;

and nothing else: no SQLAlchemy, no ``Session``, no decisions, metrics or hooks. Its msgs/s is about the most
any guard making these round trips and writing these rows can reach from CPython on this machine, so

* floor ÷ baseline is the best b2 / b5 could be without dropping a round trip or a written row, and
* guard ÷ floor is what everything else (the framework) costs.

Two paths, each interleaved in one process (:func:`bench.harness.interleaved`), median of ``--runs``:
b2's (no producer rows: the opener claims a ``CONFIRMED`` inbox row) with Powertools, and b5's (producer stub
and ``PENDING`` inbox row: confirm + settle) with the commit ceiling.

``python -m bench floor [--n 300] [--chunks 6] [--runs 3]``
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import statistics
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import psycopg

from bench.bench_ceiling import commit_loop
from bench.bench_core import guarded, powertools
from bench.harness import REDIS_URL, Runner, add_stubs, envelopes, fresh, interleaved, scratch_rel
from reliable import Envelope, Reliability
from reliable import constants as C
from reliable.models import utcnow
from reliable.stores import pg_pipeline as P
from reliable.stores import sql_text as T
from reliable.stores.lease import done_value, lease_key, processing_value
from reliable.stores.resp import encode

#: the bench's bodies are all ``{}`` (bench.harness.envelopes); the producer rows carry this hash
PAYLOAD_HASH = hashlib.sha256(b"{}").hexdigest()


class WireFloor:
    """The guard's wire work for one new message per delivery, from a bare loop (see the module docstring)."""

    def __init__(
        self, db_url: str, group: str, prefix: str, *, claim: bool, redis_url: str = REDIS_URL
    ) -> None:
        self.group, self.prefix, self.claim = group, prefix, claim
        self.conn = psycopg.connect(db_url.replace("postgresql+psycopg", "postgresql", 1), autocommit=True)
        self.prepared: set[bytes] = set()
        names = P.Statements()
        self.opener = names.get(T.pg_first(claim).replace("?", "%s"))
        self.insert = names.get("INSERT INTO bench_ledger (message_id) VALUES (%s)")
        self.progress = names.get(T.pg_progress(1).replace("?", "%s"))
        where = urlsplit(redis_url)
        self.redis = socket.create_connection((where.hostname or "127.0.0.1", where.port or 6379))
        self.redis.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        db = where.path.strip("/")
        if db and db != "0":  # the database of the URL, as the guard's client uses it
            self.redis.sendall(f"*2\r\n$6\r\nSELECT\r\n${len(db)}\r\n{db}\r\n".encode())
            if not self.redis.recv(64).startswith(b"+OK"):
                raise RuntimeError(f"redis SELECT {db} refused")
        # the previous message's done marker, sent with the next lease (the guard does not wait for it either)
        self.done_marker = b""

    def __call__(self, envs: Sequence[Envelope]) -> None:
        pg = self.conn.pgconn
        for e in envs:
            key = lease_key(self.prefix, self.group, str(e.message_id))
            self._lease(key)
            now = utcnow()
            log = (e.message_id, self.group, e.topic, e.queue_id, e.queue_offset, 0, now, "SUCCESS", "floor")
            log_row = (*log, "processed", e.topic, "")  # original topic: the delivered one (no retry)
            if self.claim:
                head: tuple[Any, ...] = (self.group, e.message_id, "CONFIRMED", 0, PAYLOAD_HASH, now, now, 0)
                params: tuple[Any, ...] = (*head, now, now, *log_row)
            else:
                confirm = (now, now, self.group, e.message_id, PAYLOAD_HASH, PAYLOAD_HASH)
                params = (*confirm, now, now, e.message_id, self.group, *log_row)
            opened = P.run(pg, self.prepared, self.opener, params, before=b"BEGIN", after=None)
            if opened.error is not None or opened.rows[0][1] != "1":
                raise RuntimeError(f"opener did not take the happy case: {opened.error or opened.rows}")
            self._ok(P.run(pg, self.prepared, self.insert, (e.message_id,), before=None, after=None))
            mark = (self.group, e.topic, "", e.queue_id, e.queue_offset, e.queue_offset, now, now, 1)
            self._ok(P.run(pg, self.prepared, self.progress, mark, before=None, after=b"COMMIT"))
            self.done_marker = encode(
                [("SET", key, done_value(PAYLOAD_HASH), "EX", str(C.DEFAULT_DONE_TTL_S))]
            )

    def _lease(self, key: str) -> None:
        """The previous done marker and this lease in one write; one reply line each (+OK, then nil)."""
        self.redis.sendall(
            self.done_marker
            + encode([("SET", key, processing_value("floor"), "NX", "PX", str(C.DEFAULT_LEASE_MS), "GET")])
        )
        want = 2 if self.done_marker else 1
        buf = b""
        while buf.count(b"\r\n") < want:
            chunk = self.redis.recv(4096)
            if not chunk:
                raise ConnectionError("Redis closed the connection")
            buf += chunk
        if not buf.endswith(b"$-1\r\n"):
            raise RuntimeError(f"lease not taken on a fresh key: {buf!r}")

    @staticmethod
    def _ok(outcome: P.Outcome) -> None:
        if outcome.error is not None:
            raise outcome.error

    def close(self) -> None:
        """Write the last message's done marker (the guard flushes its queued markers too), then close."""
        if self.done_marker:
            self.redis.sendall(self.done_marker)
            if not self.redis.recv(64).startswith(b"+OK"):
                raise RuntimeError("Redis refused the last done marker")
            self.done_marker = b""
        self.redis.close()
        self.conn.close()


def one_run(rel: Reliability, url: str, prefix: str, n: int, chunks: int) -> dict[str, float]:
    """One interleaved run of both paths; msgs/s ratios of this run."""
    out: dict[str, float] = {}
    guard_b2, guard_b5 = guarded(rel, "fl2"), guarded(rel, "fl5")
    floor_b2 = WireFloor(url, "wf2", prefix, claim=True)
    floor_b5 = WireFloor(url, "wf5", prefix, claim=False)
    ceiling, close_ceiling = commit_loop(rel)
    try:
        ids = {k: fresh(k, n) for k in ("g2", "f2", "p2", "g5", "f5", "c5")}
        add_stubs(rel, ids["g5"], "fl5")
        add_stubs(rel, ids["f5"], "wf5")
        runs: list[tuple[Runner, Sequence[Envelope]]] = [
            (guard_b2.batch_each, envelopes(ids["g2"])),
            (floor_b2, envelopes(ids["f2"])),
            (powertools(rel, f"benchpt{os.getpid()}"), envelopes(ids["p2"])),
        ]
        (g2, _), (f2, _), (p2, _) = interleaved(runs, chunks)
        runs = [
            (guard_b5.batch_each, envelopes(ids["g5"])),
            (floor_b5, envelopes(ids["f5"])),
            (ceiling, envelopes(ids["c5"])),
        ]
        (g5, _), (f5, _), (c5, _) = interleaved(runs, chunks)
    finally:
        for g in (guard_b2, guard_b5):
            g.handle.close()
        floor_b2.close()
        floor_b5.close()
        close_ceiling()
    print(
        f"  b2 path: guard {g2:6.0f}  floor {f2:6.0f}  Powertools {p2:6.0f} msg/s   "
        f"floor÷Powertools {f2 / p2:4.2f}  guard÷floor {g2 / f2:4.2f}\n"
        f"  b5 path: guard {g5:6.0f}  floor {f5:6.0f}  ceiling    {c5:6.0f} msg/s   "
        f"floor÷ceiling    {f5 / c5:4.2f}  guard÷floor {g5 / f5:4.2f}"
    )
    out["floor/powertools"], out["guard/floor b2"] = f2 / p2, g2 / f2
    out["floor/ceiling"], out["guard/floor b5"] = f5 / c5, g5 / f5
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench floor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300, help="messages per side per path per run")
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    prefix = f"benchfl{os.getpid()}"
    with scratch_rel("postgres", prefix) as (rel, url):
        results = [one_run(rel, url, prefix, args.n, args.chunks) for _ in range(args.runs)]
    for name in results[0]:
        values = [r[name] for r in results]
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:<18} median {statistics.median(values):4.2f}  ({runs})")
    return 0
