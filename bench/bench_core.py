"""b1–b3: the consumer guard against hand-written and off-the-shelf baselines, in the same run.

* b1 — ``@idempotent_consumer`` msgs/s ÷ a bare loop issuing the same work by hand on the same engine and
  Redis client: ``SET NX PX``, journal insert + watermark upsert (committed), then ``SELECT … FOR UPDATE``
  of the group's inbox row, the business insert, the conditional confirm, the stub's status (confirmed once
  no other group owes it) and the journal outcome (committed), then ``SET done``.
  Producer stubs exist (PENDING). Target ≥ 0.85 (the framework costs at most 15 %).
* b2 — the guard ÷ AWS Powertools ``idempotent_function`` with ``RedisCachePersistenceLayer``, both running
  the same business insert in a database transaction; first delivery of new ids, then the same ids again
  (duplicates). No producer stubs (the guard uses its inbox row). Targets ≥ 1.3× new, ≥ 1.5× duplicates.
  Duplicates run a third side too: the guard with ``journal_write_behind=True`` and its flush timed per chunk
  (the defaults side has write-behind on as well since issue 18, flushed by its timer thread).
* b3 — batch mode (32 per call) ÷ single-message mode, PostgreSQL with ``synchronous_commit=on``, stubs
  present. Target ≥ 5×.

Runs are interleaved in chunks (ours, baseline, ours, …) and each side's total time is used, so background
load on a shared machine hits both sides alike. Every run uses fresh message ids; setup (stubs) is not timed.

``python -m bench core [--n 300] [--chunks 6] [--only b1,b2,b3] [--backends postgres,sqlite]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis as redis_lib
from prometheus_client import CollectorRegistry
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from reliable import ConsumeResult, Envelope, GuardedHandler, Reliability, idempotent_consumer
from reliable.guard.decision import Decision, Reason
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
def database(kind: str) -> Iterator[str]:
    """A scratch database (PostgreSQL, MariaDB) or file (SQLite) of this run, removed afterwards."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="reliable-bench-") as d:
            yield f"sqlite:///{d}/bench.db"
        return
    base = make_url(MARIADB_URL if kind == "mariadb" else PG_URL)
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


def make_rel(url: str, prefix: str) -> Reliability:
    rel = Reliability(url, REDIS_URL, key_prefix=prefix)
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
            _clean_redis(rel.redis, prefix)
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


# --- handlers ---------------------------------------------------------------------------------------------
def _ledger_sql(rel: Reliability) -> str:
    return "INSERT INTO bench_ledger (message_id) VALUES (%s)".replace(
        "%s", "?" if rel.engine.dialect.paramstyle == "qmark" else "%s"
    )


class GuardUnavailable(RuntimeError):
    """The guard answered ``database_unavailable``: the figure would time a failure path, so stop."""


def handled(decisions: Sequence[Decision]) -> int:
    """How many deliveries the guard really handled (processed, or answered as a duplicate).

    A ``database_unavailable`` answer fails the bench loudly (a wrong schema or a dead server would otherwise
    look fast); other answers that are not ``SUCCESS`` (lease conflicts) are simply not counted.
    """
    n = 0
    for d in decisions:
        if d.reason is Reason.DATABASE_UNAVAILABLE:
            raise GuardUnavailable(f"guard answered {d.reason.value} for {d.message_id}: {d.detail}")
        n += d.result is ConsumeResult.SUCCESS
    return n


class Guarded:
    """The decorated bench handler plus a loop that feeds it one envelope at a time (single mode)."""

    def __init__(self, handle: GuardedHandler) -> None:
        self.handle = handle

    def batch(self, envs: Sequence[Envelope]) -> int:
        return handled(self.handle.decide_batch(envs))

    def batch_each(self, envs: Sequence[Envelope]) -> int:
        return handled([self.handle.decide(e) for e in envs])


def guarded(rel: Reliability, group: str, durable_journal: bool = False) -> Guarded:
    sql = _ledger_sql(rel)

    def handler(env: Envelope, session: Session) -> None:
        session.connection().exec_driver_sql(sql, (env.message_id,))

    return Guarded(
        idempotent_consumer(rel, group=group, registry=CollectorRegistry(), durable_journal=durable_journal)(
            handler
        )
    )


def bare_loop(rel: Reliability, group: str) -> Callable[[Sequence[Envelope]], None]:
    """The same statements as the guard's happy path, hand-written (what you would code without us)."""
    assert rel.redis is not None
    r = rel.redis
    q = "?" if rel.engine.dialect.paramstyle == "qmark" else "%s"
    pg = rel.engine.dialect.name == "postgresql"
    lock = " FOR UPDATE" if pg else ""
    ts: Callable[[Any], Any] = (lambda t: t) if pg else (lambda t: t.strftime("%Y-%m-%d %H:%M:%S.%f"))
    journal = (
        "INSERT INTO message_log (message_id, consumer_group, topic, queue_id, queue_offset, "
        f"reconsume_times, received_at, worker) VALUES ({q}, {q}, {q}, {q}, {q}, 0, {q}, 'bare') RETURNING id"
    )
    upsert = (
        "INSERT INTO consume_progress (consumer_group, topic, broker_name, queue_id, max_offset, min_offset, "
        f"created_at, updated_at, received_count) VALUES ({q}, {q}, '', {q}, {q}, {q}, {q}, {q}, 1) "
        "ON CONFLICT (consumer_group, topic, broker_name, queue_id) DO UPDATE SET "
        "max_offset = GREATEST(consume_progress.max_offset, excluded.max_offset), "
        "updated_at = excluded.updated_at, received_count = consume_progress.received_count + 1"
    )
    if not pg:
        upsert = upsert.replace("GREATEST(", "max(")
    select = f"SELECT status FROM message_inbox WHERE consumer_group = {q} AND message_id = {q}{lock}"
    business = _ledger_sql(rel)
    confirm = (
        f"UPDATE message_inbox SET status = 'CONFIRMED', confirmed_at = {q}, updated_at = {q} "
        f"WHERE consumer_group = {q} AND message_id = {q} AND status IN ('PENDING', 'DEAD')"
    )
    settle = (
        f"UPDATE message_stub SET status = 'CONFIRMED', confirmed_at = {q}, updated_at = {q} "
        f"WHERE message_id = {q} AND status IN ('PENDING', 'DEAD') AND NOT EXISTS (SELECT 1 "
        f"FROM message_inbox i WHERE i.message_id = message_stub.message_id AND i.consumer_group <> {q} "
        "AND i.status IN ('PENDING', 'DEAD'))"
    )
    outcome = f"UPDATE message_log SET outcome = 'SUCCESS' WHERE id = {q}"
    engine = rel.engine

    def run(envs: Sequence[Envelope]) -> None:
        for e in envs:
            key = f"bare:{group}:{e.message_id}"
            if not r.set(key, "processing:bare", nx=True, px=60_000):
                continue
            now = ts(utcnow())
            with engine.connect() as conn:
                with conn.begin():
                    log_id = conn.exec_driver_sql(
                        journal, (e.message_id, group, e.topic, e.queue_id, e.queue_offset, now)
                    ).scalar_one()
                    conn.exec_driver_sql(
                        upsert, (group, e.topic, e.queue_id, e.queue_offset, e.queue_offset, now, now)
                    )
                with conn.begin():
                    conn.exec_driver_sql(select, (group, e.message_id)).fetchone()
                    conn.exec_driver_sql(business, (e.message_id,))
                    if conn.exec_driver_sql(confirm, (now, now, group, e.message_id)).rowcount != 1:
                        raise RuntimeError("stub not confirmed")
                    conn.exec_driver_sql(settle, (now, now, e.message_id, group))
                    conn.exec_driver_sql(outcome, (log_id,))
            r.set(key, "done", ex=3600)

    return run


def powertools(rel: Reliability, prefix: str) -> Callable[[Sequence[Envelope]], None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
        from aws_lambda_powertools.utilities.idempotency.persistence.redis import RedisCachePersistenceLayer

        layer = RedisCachePersistenceLayer(client=rel.redis)  # type: ignore[arg-type]
    config = IdempotencyConfig(event_key_jmespath="message_id", expires_after_seconds=3600)
    sql = _ledger_sql(rel)
    engine = rel.engine

    @idempotent_function(  # type: ignore[untyped-decorator]
        data_keyword_argument="record", persistence_store=layer, config=config, key_prefix=prefix
    )
    def handle(record: dict[str, Any]) -> dict[str, Any]:
        with engine.begin() as conn:
            conn.exec_driver_sql(sql, (record["message_id"],))
        return {"ok": True}

    def run(envs: Sequence[Envelope]) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "couldn't determine the remaining time left" outside Lambda
            for e in envs:
                handle(record={"message_id": e.message_id, "queue_offset": e.queue_offset})

    return run


# --- the benchmarks ---------------------------------------------------------------------------------------
def b1(rel: Reliability, backend: str, n: int, chunks: int, durable: bool) -> dict[str, Any]:
    handle = guarded(rel, "b1", durable_journal=durable)
    ours_ids, base_ids = fresh("b1", n), fresh("b1", n)
    add_stubs(rel, ours_ids + base_ids, "b1")
    ours, base = interleaved(
        [(handle.batch_each, envelopes(ours_ids)), (bare_loop(rel, "b1"), envelopes(base_ids))], chunks
    )
    label = " (durable journal)" if durable and backend == "postgres" else ""
    return report(f"b1 {backend} vs bare loop{label}", ours, base, 0.85, "bare")


def b2(rel: Reliability, backend: str, n: int, chunks: int) -> list[dict[str, Any]]:
    handle = guarded(rel, "b2")
    pt = powertools(rel, f"benchpt{os.getpid()}")
    ours_envs, pt_envs = envelopes(fresh("b2", n)), envelopes(fresh("b2", n))
    new = interleaved([(handle.batch_each, ours_envs), (pt, pt_envs)], chunks)

    def again(envs: Sequence[Envelope]) -> list[Envelope]:  # redelivered at later offsets
        return [Envelope(e.message_id, e.topic, e.queue_id, e.queue_offset + n, e.body) for e in envs]

    # the same guard with the opt-in write-behind journal for done duplicates; its flush (one multi-row
    # INSERT) is timed: every chunk ends with one, so it is paid at least once per chunk
    url = rel.engine.url.render_as_string(hide_password=False)
    rel_wb = Reliability(url, REDIS_URL, key_prefix=rel.settings.key_prefix, journal_write_behind=True)
    wb = guarded(rel_wb, "b2")

    def behind(envs: Sequence[Envelope]) -> int:
        n = wb.batch_each(envs)
        wb.handle.flush_journal()
        return n

    try:
        dup = interleaved(
            [(handle.batch_each, again(ours_envs)), (pt, again(pt_envs)), (behind, again(ours_envs))], chunks
        )
    finally:  # both guards write behind on a timer thread: stop them before the database goes
        handle.handle.close()
        wb.handle.close()
        rel_wb.close()
    return [
        report(f"b2 {backend} new ids", new[0], new[1], 1.3, "powertools"),
        report(f"b2 {backend} duplicates", dup[0], dup[1], 1.5, "powertools"),
        report(f"b2 {backend} duplicates, write-behind journal", dup[2], dup[1], 1.5, "powertools"),
    ]


def b3(rel: Reliability, backend: str, n: int, chunks: int) -> dict[str, Any]:
    with rel.engine.connect() as conn:
        sync = conn.exec_driver_sql("SHOW synchronous_commit").scalar()
    handle = guarded(rel, "b3")
    size = 32
    n = max(size * chunks, n - n % (size * chunks))
    batch_ids, single_ids = fresh("b3", n), fresh("b3", n)
    add_stubs(rel, batch_ids + single_ids, "b3")

    def batched(envs: Sequence[Envelope]) -> int:
        return sum(handle.batch(envs[i : i + size]) for i in range(0, len(envs), size))

    ours, base = interleaved(
        [(batched, envelopes(batch_ids)), (handle.batch_each, envelopes(single_ids))], chunks
    )
    return report(f"b3 {backend} batch {size} (synchronous_commit={sync})", ours, base, 5.0, "single")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench core", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300, help="messages per timed run")
    ap.add_argument("--chunks", type=int, default=6, help="alternating timed chunks per side")
    ap.add_argument("--only", default="b1,b2,b3")
    ap.add_argument("--backends", default="postgres,sqlite")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    prefix = f"bench{os.getpid()}"
    results: list[dict[str, Any]] = []
    for backend in args.backends.split(","):
        with database(backend) as url:
            rel = make_rel(url, prefix)
            try:
                if "b1" in only:
                    results.append(b1(rel, backend, args.n, args.chunks, durable=True))
                    if backend == "postgres":
                        results.append(b1(rel, backend, args.n, args.chunks, durable=False))
                if "b2" in only:
                    results.extend(b2(rel, backend, args.n, args.chunks))
                if "b3" in only and backend == "postgres":
                    results.append(b3(rel, backend, args.n, args.chunks))
            finally:
                _clean_redis(rel.redis, prefix)
                rel.close()
    return 0


def _clean_redis(client: redis_lib.Redis | redis_lib.RedisCluster | None, prefix: str) -> None:
    if client is None:
        return
    for pattern in (f"{prefix}:*", "bare:*", f"benchpt{os.getpid()}*"):
        keys = list(client.scan_iter(pattern, count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
