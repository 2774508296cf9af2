"""Round trips and commits the guard pays per delivery, per path (issue 18 item 1), with the defaults.

Why count instead of time: a round trip is what the guard cannot make cheaper on a busy or remote database,
and a count does not depend on the machine's load, so before/after comparisons hold on a shared machine.

What is counted, on the calling thread and any background thread alike, averaged per delivery:
* ``db``: statements sent to the database (the guard's hand-rendered SQL on the DBAPI cursor, the handler's
  and SQLAlchemy's statements), plus one per transaction on PostgreSQL for psycopg's separate ``BEGIN``;
  psycopg ``executemany`` is one round trip (pipelined), PyMySQL's one per row except multi-row INSERTs.
* ``commits``: ``COMMIT`` sent (explicit, or a statement run in autocommit mode).
* ``redis``: Redis round trips (one command, or one pipeline / transaction).

Run: ``python -m bench roundtrips [--backends postgres,mariadb] [--n 20]``.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis as redis_lib
from prometheus_client import CollectorRegistry
from sqlalchemy import bindparam, event, text
from sqlalchemy.orm import Session

from bench.bench_core import add_stubs, database, envelopes, fresh, make_rel
from reliable import Envelope, Reliability, idempotent_consumer
from reliable.stores.sql_runner import DbapiRunner


class Counts:
    def __init__(self) -> None:
        self.db = self.commits = self.redis = 0

    def snapshot(self) -> tuple[int, int, int]:
        return self.db, self.commits, self.redis


COUNTS = Counts()


def _autocommit(dbapi_conn: Any) -> bool:
    get = getattr(dbapi_conn, "get_autocommit", None)  # PyMySQL
    return bool(get() if get is not None else getattr(dbapi_conn, "autocommit", False))


def _many_cost(pg: bool, sql: str, params: Any) -> int:
    if pg or sql.lstrip().upper().startswith("INSERT"):
        return 1
    return len(params)


def install(rel: Reliability) -> None:
    """Count the database and Redis traffic of ``rel`` (idempotent per process for the class patches)."""
    pg = rel.dialect == "postgresql"
    if not getattr(DbapiRunner, "_counted", False):
        original = DbapiRunner._cursor_call

        def counted(self: DbapiRunner, conn: Any, sql: str, params: Any, many: bool, fetch: bool) -> Any:
            dbapi = conn.connection.dbapi_connection
            COUNTS.db += _many_cost(self.engine.dialect.name == "postgresql", sql, params) if many else 1
            if _autocommit(dbapi):
                COUNTS.commits += 1
            return original(self, conn, sql, params, many, fetch)

        DbapiRunner._cursor_call = counted  # type: ignore[method-assign]
        DbapiRunner._counted = True  # type: ignore[attr-defined]
        pipe_exec = redis_lib.client.Pipeline.execute

        def pipe(self: Any, *a: Any, **k: Any) -> Any:
            if self.command_stack:
                COUNTS.redis += 1
            return pipe_exec(self, *a, **k)

        redis_lib.client.Pipeline.execute = pipe  # type: ignore[method-assign]
        command = redis_lib.Redis.execute_command

        def cmd(self: Any, *a: Any, **k: Any) -> Any:
            COUNTS.redis += 1
            return command(self, *a, **k)

        redis_lib.Redis.execute_command = cmd  # type: ignore[method-assign]

    @event.listens_for(rel.engine, "before_cursor_execute")
    def _stmt(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        COUNTS.db += _many_cost(pg, statement, params) if many else 1

    @event.listens_for(rel.engine, "begin")
    def _begin(conn: Any) -> None:
        if pg:
            COUNTS.db += 1

    @event.listens_for(rel.engine, "commit")
    def _commit(conn: Any) -> None:
        COUNTS.db += 1
        COUNTS.commits += 1


def per_delivery(run: Callable[[], None], deliveries: int) -> tuple[float, float, float]:
    before = COUNTS.snapshot()
    run()
    after = COUNTS.snapshot()
    return tuple((a - b) / deliveries for a, b in zip(after, before, strict=True))  # type: ignore[return-value]


def handler(env: Envelope, session: Session) -> None:
    session.connection().exec_driver_sql(
        "INSERT INTO bench_ledger (message_id) VALUES (%s)", (env.message_id,)
    )


def measure(rel: Reliability, prefix: str, n: int) -> dict[str, tuple[float, float, float]]:
    guard = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(handler)
    other = idempotent_consumer(rel, group="h", registry=CollectorRegistry())(handler)
    out: dict[str, tuple[float, float, float]] = {}

    def each(envs: Sequence[Envelope], h: Any = guard) -> Callable[[], None]:
        return lambda: [h(e) for e in envs] and None

    warm = envelopes(fresh("warm", n))
    each(warm)()
    stubbed = fresh("stub", n)
    add_stubs(rel, stubbed, "g")
    out["new message, producer stub"] = per_delivery(each(envelopes(stubbed)), n)
    bare = envelopes(fresh("inbox", n))
    out["new message, no stub (inbox)"] = per_delivery(each(bare), n)
    out["duplicate answered by Redis"] = per_delivery(each(bare), n)
    assert rel.redis is not None
    for key in rel.redis.scan_iter(f"{prefix}*"):
        rel.redis.delete(key)
    out["duplicate answered by the database"] = per_delivery(each(bare), n)
    fan = fresh("fan", n)
    add_stubs(rel, fan, "g")
    add_stubs_group(rel, fan, "h")
    each(envelopes(fan))()
    out["fan-out: last of 2 groups confirms"] = per_delivery(each(envelopes(fan), other), n)
    batch = envelopes(fresh("batch", 32))
    out["batch of 32 new, per batch"] = per_delivery(lambda: guard.batch(batch) and None, 1)
    return out


def add_stubs_group(rel: Reliability, ids: Sequence[str], group: str) -> None:
    """A second group's PENDING inbox rows for stubs :func:`add_stubs` wrote (fan-out)."""
    with rel.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO message_inbox (consumer_group, message_id, status, attempts, payload_hash, "
                "resend_count, created_at, updated_at) SELECT :g, message_id, 'PENDING', 0, payload_hash, 0, "
                "created_at, updated_at FROM message_stub WHERE message_id IN :ids"
            ).bindparams(bindparam("ids", expanding=True)),
            {"g": group, "ids": list(ids)},
        )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench roundtrips", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20, help="deliveries per path")
    ap.add_argument("--backends", default="postgres,mariadb")
    args = ap.parse_args(argv)
    for kind in args.backends.split(","):
        with database(kind) as url:
            prefix = f"rt{uuid.uuid4().hex[:8]}"
            rel = make_rel(url, prefix)
            install(rel)
            try:
                print(f"-- {kind} (db round trips / commits / redis round trips per delivery)")
                for path, (db, commits, red) in measure(rel, prefix, args.n).items():
                    print(f"{path:40s} {db:6.2f} {commits:6.2f} {red:6.2f}")
            finally:
                rel.close()
    return 0
