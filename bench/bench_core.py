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
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session

from bench.harness import (
    REDIS_URL,
    GuardUnavailable,
    add_stubs,
    clean_redis,
    database,
    envelopes,
    fresh,
    interleaved,
    ledger_sql,
    make_rel,
    report,
)
from reliable import ConsumeResult, Envelope, GuardedHandler, Reliability, idempotent_consumer
from reliable.guard.decision import Decision, Reason
from reliable.models import utcnow

# --- handlers ---------------------------------------------------------------------------------------------


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
    sql = ledger_sql(rel)

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
    business = ledger_sql(rel)
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
    sql = ledger_sql(rel)
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
                clean_redis(rel.redis, prefix)
                rel.close()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
