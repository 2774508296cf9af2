"""Round trips and commits the guard pays per delivery, per path (issue 18 item 1), with the defaults.

Why count instead of time: a round trip is what the guard cannot make cheaper on a busy or remote database,
and a count does not depend on the machine's load, so before/after comparisons hold on a shared machine.

What is counted, per delivery, on the calling thread (what a delivery waits for; background writers — the
write-behind journal, the done-marker timer — are counted apart as ``bg``):
* ``db``: database round trips: every statement the guard sends (a statement carrying ``BEGIN`` or
  ``COMMIT`` with it is one), the handler's and SQLAlchemy's statements, psycopg's own ``BEGIN`` when it sends
  one, a ``COMMIT``/``ROLLBACK`` that reaches the server, and a ping the pool sends at checkout (with the
  engine's defaults only for a connection idle over ``pool_ping_idle_s`` or found hung up: none in steady
  use; SQLAlchemy's ``pool_pre_ping`` would add one per delivery).
* ``commits``: commits that reach the server (a ``COMMIT``, or a statement that commits by itself).
* ``redis``: Redis round trips (one command, or one pipeline).

:class:`Counter` is also what ``tests/core/test_round_trips.py`` asserts on, so the figures cannot regress
silently. Run: ``python -m bench roundtrips [--backends postgres,mariadb,sqlite] [--n 20]``.
"""

from __future__ import annotations

import argparse
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis as redis_lib
from prometheus_client import CollectorRegistry
from sqlalchemy import Connection, bindparam, event, text
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.orm import Session

from bench.harness import add_stubs, database, envelopes, fresh, make_rel
from reliable import Envelope, Reliability, idempotent_consumer
from reliable.stores import sql_runner


def _pg_busy(dbapi_conn: Any) -> bool:
    """Whether a psycopg connection's server session is inside a transaction block (COMMIT would be sent)."""
    import psycopg

    driver = getattr(dbapi_conn, "driver_connection", dbapi_conn)
    driver = getattr(driver, "_connection", driver)  # SQLAlchemy's asyncio adapter
    status = driver.pgconn.transaction_status
    return bool(status != psycopg.pq.TransactionStatus.IDLE)


def _autocommit(dbapi_conn: Any) -> bool:
    return bool(getattr(dbapi_conn, "autocommit", False))


def _psycopg_begins(dbapi_conn: Any) -> bool:
    """Whether psycopg sends a ``BEGIN`` of its own before the statement about to go out: it does when it is
    not in autocommit mode and the server session is idle (a pipelined opener's ``BEGIN`` makes it busy)."""
    return not _autocommit(dbapi_conn) and not _pg_busy(dbapi_conn)


class Counter:
    """Counts the round trips of one ``Reliability`` on the thread that calls :meth:`attach` (see above)."""

    def __init__(self, rel: Reliability) -> None:
        self.rel = rel
        self.pg = rel.dialect == "postgresql"
        self.thread = threading.get_ident()
        self.db = self.commits = self.redis = self.bg = self.pings = 0
        self._listeners: list[tuple[str, Callable[..., None]]] = []

    def snapshot(self) -> tuple[int, int, int]:
        return self.db, self.commits, self.redis

    def _mine(self) -> bool:
        if threading.get_ident() == self.thread:
            return True
        self.bg += 1
        return False

    # --- hooks ----------------------------------------------------------------------------------------
    def attach(self) -> Counter:
        sql_runner.STATEMENT_HOOKS.append(self._statement)
        engine = self.rel.engine
        listeners: list[tuple[str, Callable[..., None]]] = [
            ("before_cursor_execute", self._sqlalchemy_statement),
            ("commit", self._commit),
            ("rollback", self._rollback),
        ]
        if self.rel.dialect == "sqlite":  # BEGIN IMMEDIATE is sent by the dialect's do_begin, not a cursor
            listeners.append(("begin", self._begin))
        for name, fn in listeners:
            event.listen(engine, name, fn)
            self._listeners.append((name, fn))
        real_ping = engine.dialect.do_ping

        def ping(dbapi_connection: DBAPIConnection) -> bool:
            if self._mine():
                self.db += 1
                self.pings += 1
            return real_ping(dbapi_connection)

        engine.dialect.do_ping = ping  # type: ignore[method-assign]  # instance attribute, removed on detach
        if self.rel.redis is not None:
            self.rel.redis.connection_pool.connection_class = _counting_connection(self)  # type: ignore[union-attr]
            self.rel.redis.connection_pool.reset()  # type: ignore[union-attr]
        return self

    def detach(self) -> None:
        sql_runner.STATEMENT_HOOKS.remove(self._statement)
        for name, fn in self._listeners:
            event.remove(self.rel.engine, name, fn)
        vars(self.rel.engine.dialect).pop("do_ping", None)

    def _statement(self, conn: Connection, sql: str, params: Any, many: bool) -> None:
        if not self._mine():
            return
        edge = sql.rstrip().endswith(("BEGIN", "COMMIT"))  # sent through libpq with its BEGIN / COMMIT
        if self.pg and not edge and _psycopg_begins(conn.connection.dbapi_connection):
            self.db += 1  # psycopg sends BEGIN before this statement
        # psycopg pipelines an executemany into one round trip; PyMySQL folds a multi-row INSERT into one
        # statement but sends any other executemany row by row (SQLite: one call per row, in-process)
        folded = self.pg or sql.lstrip().upper().startswith("INSERT")
        self.db += len(params) if many and not folded else 1
        if sql.rstrip().endswith("COMMIT"):
            self.commits += 1
        elif self.pg and not sql.rstrip().endswith("BEGIN") and not sql.lstrip().upper().startswith("SELECT"):
            dbapi = conn.connection.dbapi_connection
            if _autocommit(dbapi) and not _pg_busy(dbapi):
                self.commits += 1  # a statement in autocommit mode outside a block commits by itself

    def _sqlalchemy_statement(self, conn: Any, cursor: Any, statement: str, *a: Any) -> None:
        if self._mine():
            self.db += 1
            if self.pg and _psycopg_begins(conn.connection.dbapi_connection):
                self.db += 1  # psycopg sends BEGIN before this statement

    def _begin(self, conn: Connection) -> None:
        if self._mine():
            self.db += 1

    def _commit(self, conn: Connection) -> None:
        if not self._mine():
            return
        if not self.pg or _pg_busy(conn.connection.dbapi_connection):
            self.db += 1
            self.commits += 1

    def _rollback(self, conn: Connection) -> None:
        if self._mine() and (not self.pg or _pg_busy(conn.connection.dbapi_connection)):
            self.db += 1


def _counting_connection(counter: Counter) -> type[redis_lib.Connection]:
    class CountingConnection(redis_lib.Connection):
        _handshake = False

        def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
            # a new pool connection's handshake (CLIENT SETINFO …) is paid once per connection, not per
            # delivery: it happens whenever another thread (the done-marker timer) holds the pooled one
            self._handshake = True
            try:
                super().connect_check_health(*args, **kwargs)
            finally:
                self._handshake = False

        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            if counter._mine() and not self._handshake:  # one packed send: one command or a pipeline
                counter.redis += 1
            super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]

    return CountingConnection


def per_delivery(counts: Counter, run: Callable[[], object], deliveries: int) -> tuple[float, float, float]:
    before = counts.snapshot()
    run()
    after = counts.snapshot()
    return tuple((a - b) / deliveries for a, b in zip(after, before, strict=True))  # type: ignore[return-value]


def handler(env: Envelope, session: Session) -> None:
    conn = session.connection()
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    conn.exec_driver_sql(f"INSERT INTO bench_ledger (message_id) VALUES ({mark})", (env.message_id,))


def failing(env: Envelope, session: Session) -> None:
    handler(env, session)
    raise RuntimeError("handler failed (round-trip count)")


def measure(rel: Reliability, counts: Counter, prefix: str, n: int) -> dict[str, tuple[float, float, float]]:
    """Per path: (db round trips, commits, Redis round trips) per delivery, on the calling thread."""
    guard = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(handler)
    other = idempotent_consumer(rel, group="h", registry=CollectorRegistry())(handler)
    broken = idempotent_consumer(rel, group="f", registry=CollectorRegistry())(failing)
    out: dict[str, tuple[float, float, float]] = {}

    def each(envs: Sequence[Envelope], h: Any = guard) -> Callable[[], object]:
        return lambda: [h(e) for e in envs] and None

    warm = envelopes(fresh("warm", n))
    each(warm)()
    stubbed = fresh("stub", n)
    add_stubs(rel, stubbed, "g")
    out["new message, producer stub"] = per_delivery(counts, each(envelopes(stubbed)), n)
    bare = envelopes(fresh("inbox", n))
    out["new message, no stub (inbox)"] = per_delivery(counts, each(bare), n)
    out["duplicate answered by Redis"] = per_delivery(counts, each(bare), n)
    assert rel.redis is not None
    for key in rel.redis.scan_iter(f"{prefix}*"):
        rel.redis.delete(key)
    out["duplicate answered by the database"] = per_delivery(counts, each(bare), n)
    fan = fresh("fan", n)
    add_stubs(rel, fan, "g")
    add_stubs_group(rel, fan, "h")
    each(envelopes(fan))()
    out["fan-out: last of 2 groups confirms"] = per_delivery(counts, each(envelopes(fan), other), n)
    out["handler fails (first attempt)"] = per_delivery(counts, each(envelopes(stubbed), broken), n)
    batch = envelopes(fresh("batch", 32))
    out["batch of 32 new, per batch"] = per_delivery(counts, lambda: guard.batch(batch) and None, 1)
    guard.close()
    other.close()
    broken.close()
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
    ap.add_argument("--backends", default="postgres,mariadb,sqlite")
    args = ap.parse_args(argv)
    for kind in args.backends.split(","):
        with database(kind) as url:
            prefix = f"rt{uuid.uuid4().hex[:8]}"
            rel = make_rel(url, prefix)
            counts = Counter(rel).attach()
            try:
                print(
                    f"-- {kind} (per delivery: db round trips / commits / redis round trips; pings included)"
                )
                for path, (db, commits, red) in measure(rel, counts, prefix, args.n).items():
                    print(f"{path:40s} {db:6.2f} {commits:6.2f} {red:6.2f}")
            finally:
                counts.detach()
                rel.close()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
