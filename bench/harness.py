"""What every bench shares: the services it runs against, scratch databases and ``Reliability`` objects,
producer stubs, fresh ids, and the timing method (interleaved chunks, ours ÷ baseline from the same run).

The benches themselves live in their own modules (``bench_core`` for b1–b3, ``bench_ceiling`` for b5, …).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis as redis_lib
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert, text
from sqlalchemy.engine import make_url

from reliable import Envelope, Reliability
from reliable.models import utcnow

PG_URL = os.environ.get("RELIABLE_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("RELIABLE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
MARIADB_URL = os.environ.get("RELIABLE_BENCH_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test")

_md = MetaData()
ledger = Table(
    "bench_ledger",
    _md,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(64), nullable=False),
)


# --- environment ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def database(kind: str, server_url: str | None = None) -> Iterator[str]:
    """A scratch database (PostgreSQL, MariaDB) or file (SQLite) of this run, removed afterwards; created on
    ``server_url`` when given, else on the benches' server of that kind."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="reliable-bench-") as d:
            yield f"sqlite:///{d}/bench.db"
        return
    base = make_url(server_url or (MARIADB_URL if kind == "mariadb" else PG_URL))
    name = f"reliable_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        force = "" if kind == "mariadb" else " WITH (FORCE)"
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}{force}"))
        admin.dispose()
        admin.dispose()


def make_rel(url: str, prefix: str, redis_url: str = REDIS_URL) -> Reliability:
    rel = Reliability(url, redis_url, key_prefix=prefix)
    rel.create_schema()
    _md.create_all(rel.engine)
    return rel


@contextlib.contextmanager
def scratch_rel(kind: str, prefix: str) -> Iterator[tuple[Reliability, str]]:
    """(:func:`make_rel` on a scratch database of ``kind``, its URL); Redis keys under ``prefix`` removed
    afterwards."""
    with database(kind) as url:
        rel = make_rel(url, prefix)
        try:
            yield rel, url
        finally:
            clean_redis(rel.redis, prefix)
            rel.close()


def add_stubs(rel: Reliability, ids: Sequence[str], group: str | Sequence[str]) -> None:
    """A PENDING stub per id, and a PENDING inbox row per id for ``group`` (or each of several groups)."""
    import hashlib

    groups = [group] if isinstance(group, str) else list(group)

    h = hashlib.sha256(b"{}").hexdigest()
    now = utcnow()
    rows = [
        {
            "message_id": m,
            "topic": "bench",
            "content": b"{}",
            "payload_hash": h,
            "status": "PENDING",
            "send_count": 1,
            "created_at": now,
            "updated_at": now,
        }
        for m in ids
    ]
    inbox = [
        {
            "consumer_group": g,
            "message_id": m,
            "status": "PENDING",
            "attempts": 0,
            "payload_hash": h,
            "resend_count": 0,
            "created_at": now,
            "updated_at": now,
        }
        for g in groups
        for m in ids
    ]
    from reliable.models import MessageInbox, MessageStub

    with rel.engine.begin() as conn:
        conn.execute(insert(MessageStub), rows)
        conn.execute(insert(MessageInbox), inbox)


def envelopes(ids: Sequence[str]) -> list[Envelope]:
    return [Envelope(m, "bench", n % 4, n, b"{}") for n, m in enumerate(ids)]


def fresh(tag: str, n: int) -> list[str]:
    run = uuid.uuid4().hex[:8]
    return [f"{tag}-{run}-{i}" for i in range(n)]


#: runs a chunk of deliveries; returns how many it really handled (None: all of them)
Runner = Callable[[Sequence[Envelope]], int | None]


def interleaved(runs: Sequence[tuple[Runner, Sequence[Envelope]]], chunks: int) -> list[tuple[float, float]]:
    """(msgs/s, process-CPU µs per message) of each runner over its envelopes, timed in alternating chunks.

    Alternating small chunks (A, B, A, B, …) instead of whole runs means a burst of background load on a
    shared machine lands on both sides alike. CPU time of this process is reported too: on a loaded machine it
    is steadier than wall time, though it leaves out the time spent inside the database and Redis.
    """
    spent = [0.0] * len(runs)
    cpu = [0.0] * len(runs)
    done = [0] * len(runs)
    for c in range(chunks):
        order = list(range(len(runs)))
        if c % 2:  # A B, B A, A B, …: neither side always runs right after the other
            order.reverse()
        for i in order:
            run, envs = runs[i]
            size = -(-len(envs) // chunks)
            part = envs[c * size : (c + 1) * size]
            t, p = time.perf_counter(), time.process_time()
            handled = run(part)
            spent[i] += time.perf_counter() - t
            cpu[i] += time.process_time() - p
            done[i] += len(part) if handled is None else handled
    if not all(done):
        raise GuardUnavailable(f"a side handled no delivery at all ({done})")
    return [(d / s, 1e6 * u / d) for d, s, u in zip(done, spent, cpu, strict=True)]


def report(
    name: str, ours: tuple[float, float], base: tuple[float, float], target: float, label: str
) -> dict[str, Any]:
    ratio = ours[0] / base[0]
    verdict = "ok" if ratio >= target else f"MISSED by {100 * (1 - ratio / target):.0f}%"
    print(
        f"{name:<44} ours {ours[0]:7.0f} msg/s ({ours[1]:5.0f} µs CPU)   {label:<10} {base[0]:7.0f} msg/s "
        f"({base[1]:5.0f} µs CPU)   ratio {ratio:5.2f} (CPU {base[1] / ours[1]:4.2f})  "
        f"target ≥ {target}  {verdict}"
    )
    return {"name": name, "ours": ours, "base": base, "ratio": ratio, "target": target}


class GuardUnavailable(RuntimeError):
    """The guard answered ``database_unavailable``: the figure would time a failure path, so stop."""


def clean_redis(client: redis_lib.Redis | redis_lib.RedisCluster | None, prefix: str) -> None:
    if client is None:
        return
    for pattern in (f"{prefix}:*", "bare:*", f"benchpt{os.getpid()}*"):
        keys = list(client.scan_iter(pattern, count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])


def ledger_sql(rel: Reliability) -> str:
    return "INSERT INTO bench_ledger (message_id) VALUES (%s)".replace(
        "%s", "?" if rel.engine.dialect.paramstyle == "qmark" else "%s"
    )
