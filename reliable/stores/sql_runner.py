"""Running hand-rendered SQL on the DBAPI cursor of a SQLAlchemy ``Connection`` (split from :mod:`.sql`).

Why: the guard runs once per delivery, and ``exec_driver_sql`` costs about as much Python as a local SQLite
statement itself. :class:`DbapiRunner` renders each statement once per dialect and row count into the driver's
placeholder style and runs it inside the caller's transaction, re-raising driver errors as SQLAlchemy's
``DBAPIError`` so callers handle one exception family. :class:`reliable.stores.sql.SqlStore` owns one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, cast

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import DBAPIError

from reliable.stores import pg_pipeline
from reliable.stores.sql_text import ts_converter

_MOGRIFY = "reliable_mogrify_cursor"

#: called with (connection, statement, parameters, executemany) before every statement a runner sends, for
#: counting round trips per path (``python -m bench roundtrips`` and a test); empty in production.
STATEMENT_HOOKS: list[Callable[[Connection, str, Any, bool], None]] = []


class DbapiRunner:
    """Render-once, run-on-the-cursor execution for one engine (thread-safe: the cache only grows)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self._qmark = engine.dialect.paramstyle == "qmark"
        #: how a UTC-aware datetime is bound on this dialect
        self.ts: Callable[[dt.datetime], Any] = ts_converter(self.dialect)
        self._cache: dict[tuple[str, int, int], str] = {}
        self._dbapi_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        #: whether ``BEGIN``/``COMMIT`` ride on the first/last statement of a transaction (psycopg only; the
        #: connection then runs in driver autocommit mode while the guard drives the transaction itself)
        self.piggybacks = self.dialect == "postgresql" and engine.dialect.driver == "psycopg"
        #: the synchronous psycopg connection class, if this engine may hand one out (see :meth:`_pipelined`)
        self._sync_psycopg: type | None = None
        #: the guard's statements as libpq pipelines send them (``$n`` placeholders, prepared names)
        self._statements = pg_pipeline.Statements()
        if self.piggybacks:
            import psycopg

            self._sync_psycopg = psycopg.Connection
            _watch_rollbacks(engine)

    # --- rendering -----------------------------------------------------------------------------------
    def render(self, text: str) -> str:
        """``?`` placeholders in the driver's style (psycopg and PyMySQL take ``%s``)."""
        return text if self._qmark else text.replace("?", "%s")

    def cached(self, name: str, n: int, build: Callable[[int], str], m: int = 0) -> str:
        """Render once per (statement, row count): the IN-lists and VALUES lists vary only in length."""
        key = (name, n, m)
        sql = self._cache.get(key)
        if sql is None:
            sql = self._cache[key] = self.render(build(n))
        return sql

    # --- execution ----------------------------------------------------------------------------------
    def _cursor_call(self, conn: Connection, sql: str, params: Any, many: bool, fetch: bool) -> Any:
        """Run one statement on the DBAPI cursor of ``conn``'s connection (inside its transaction).

        ``exec_driver_sql`` costs about as much Python as a local SQLite statement itself, so the guard's own
        statements skip it; driver errors are re-raised as SQLAlchemy's ``DBAPIError`` (and a dropped
        connection is invalidated) exactly as SQLAlchemy would, so callers handle one exception family.
        """
        for hook in STATEMENT_HOOKS:
            hook(conn, sql, params, many)
        fairy = conn.connection
        cur = fairy.cursor()
        try:
            if many:
                cur.executemany(sql, params)
            else:
                cur.execute(sql, params)
            return cur.fetchall() if fetch else cur.rowcount
        except self._dbapi_error as exc:
            raise self._wrapped(conn, sql, params, exc, cur) from exc
        finally:
            cur.close()

    def _wrapped(self, conn: Connection, sql: str, params: Any, exc: Exception, cur: Any) -> Exception:
        """``exc`` as SQLAlchemy's ``DBAPIError``; a disconnect invalidates ``conn``, as SQLAlchemy does (a
        connection the caller invalidated already counts as one)."""
        if not conn.invalidated and self.engine.dialect.is_disconnect(
            cast(Any, exc), conn.connection.dbapi_connection, cur
        ):
            conn.invalidate(exc)
        return DBAPIError.instance(
            sql,
            params,
            exc,
            self._dbapi_error,
            connection_invalidated=conn.invalidated,
            dialect=self.engine.dialect,
        )

    def all(self, conn: Connection, sql: str, params: Any, *, begin: bool = False) -> list[Any]:
        """Rows of one statement; ``begin`` (PostgreSQL): open the transaction in the same round trip."""
        if begin and self.piggybacks:
            if self.pipelines(conn):
                return cast(list[Any], self._pipelined(conn, sql, params, "BEGIN", True))
            rows: list[Any] = self._cursor_call(
                conn, self._literal(conn, sql, params) + "; BEGIN", None, False, True
            )
            return rows
        rows = self._cursor_call(conn, sql, params, False, True)
        return rows

    def run(
        self, conn: Connection, sql: str, params: Any, *, many: bool = False, commit: bool = False
    ) -> int:
        """Row count of one statement; ``commit`` (PostgreSQL): send ``COMMIT`` in the same round trip."""
        if commit and self.piggybacks:
            if self.pipelines(conn):
                return int(self._pipelined(conn, sql, params, "COMMIT", False))
            return int(
                self._cursor_call(conn, self._literal(conn, sql, params) + "; COMMIT", None, False, False)
            )
        return int(self._cursor_call(conn, sql, params, many, False))

    # --- PostgreSQL: BEGIN and COMMIT ride on a statement -------------------------------------------------
    def pipelines(self, conn: Connection) -> bool:
        """Whether ``conn`` is a synchronous psycopg connection (asyncio takes :meth:`_literal`)."""
        return self._sync_psycopg is not None and isinstance(
            conn.connection.driver_connection, self._sync_psycopg
        )

    def _pipelined(self, conn: Connection, sql: str, params: Any, edge: str, fetch: bool) -> Any:
        """``BEGIN`` + ``sql`` or ``sql`` + ``COMMIT`` in one round trip through libpq's pipeline mode.

        ``sql`` is prepared once per connection (:mod:`reliable.stores.pg_pipeline` says what happens when
        the server loses it). A statement error surfaces here as SQLAlchemy's ``DBAPIError`` after the round
        trip completed; a connection failure invalidates ``conn``.
        """
        text = f"{sql}; {edge}"
        for hook in STATEMENT_HOOKS:  # one round trip, counted as the simple-query form would be
            hook(conn, text, params, False)
        fairy = conn.connection
        driver: Any = fairy.driver_connection
        pgconn = driver.pgconn
        prepared = pg_pipeline.prepared_on(fairy.info, pgconn)
        statement = self._statements.get(sql)
        opener = edge == "BEGIN"
        edge_sql = edge.encode()
        try:
            out = pg_pipeline.run(
                pgconn,
                prepared,
                statement,
                params,
                before=edge_sql if opener else None,
                after=None if opener else edge_sql,
            )
            if opener and out.error is not None and out.error.sqlstate == pg_pipeline.LOST_STATEMENT:
                # the session lost the statement behind the guard's back (psycopg deallocates every prepared
                # statement when it sees a DROP or ALTER on the connection, a pooler may DISCARD ALL): nothing
                # of this transaction has run, so end it and open it again, parsing the statement this time
                pg_pipeline.roll_back(pgconn)
                out = pg_pipeline.run(pgconn, prepared, statement, params, before=edge_sql, after=None)
        except BaseException as exc:  # failed mid-way (socket, interrupt): its protocol state is unknown
            conn.invalidate(exc if isinstance(exc, Exception) else None)
            if isinstance(exc, self._dbapi_error):
                raise self._wrapped(conn, text, params, exc, None) from exc
            raise
        if out.error is not None:
            raise self._wrapped(conn, text, params, out.error, None) from out.error
        return out.rows if fetch else out.rowcount

    def _literal(self, conn: Connection, sql: str, params: Any) -> str:
        """``sql`` with ``params`` bound client-side (psycopg's own quoting), for a multi-statement query.

        psycopg sends a parameterless query with the simple query protocol, which admits several statements
        in one message: ``stmt; BEGIN`` runs ``stmt`` in an implicit transaction block that ``BEGIN`` turns
        into the regular transaction the guard continues (PostgreSQL keeps the effects of the statements
        before it), and ``stmt; COMMIT`` ends it. One round trip each instead of two.
        """
        info = conn.connection.info
        cur = info.get(_MOGRIFY)
        if cur is None:
            import psycopg

            driver = conn.connection.driver_connection
            cls = (
                psycopg.AsyncClientCursor
                if isinstance(driver, psycopg.AsyncConnection)
                else psycopg.ClientCursor
            )
            cur = info[_MOGRIFY] = cls(driver)  # type: ignore[arg-type]
        text: str = cur.mogrify(sql, params)
        return text

    def execute(self, conn: Connection, sql: str) -> None:
        """A parameterless statement (e.g. ``SET TRANSACTION …``) through the same lean path."""
        self._cursor_call(conn, sql, (), False, False)

    def autocommit(self, conn: Connection, on: bool) -> None:
        """Switch the DBAPI connection's autocommit (PostgreSQL journal); only outside a transaction."""
        # dbapi_connection, not driver_connection: under the asyncio engine it is SQLAlchemy's adapter, which
        # awaits psycopg's set_autocommit (the async driver object refuses the plain assignment)
        conn.connection.dbapi_connection.autocommit = on  # type: ignore[union-attr]


#: set on a dialect whose ``do_rollback`` already forgets prepared statements (:func:`_watch_rollbacks`)
_WATCHED = "reliable_forgets_prepared_on_rollback"


def _watch_rollbacks(engine: Engine) -> None:
    """Forget what was prepared on a connection when psycopg may deallocate it (once per engine).

    Every rollback SQLAlchemy sends — a ``Connection``'s, or the pool's reset at check-in — goes through the
    dialect's ``do_rollback``, so that is wrapped, on this engine's dialect only. Not an engine ``rollback``
    event: any engine-level listener makes SQLAlchemy dispatch events at every begin, statement and commit
    of every connection of the engine, handlers' statements included. The pool's ``reset`` event (which
    does not) covers a pool that resets without a rollback.
    """
    dialect = engine.dialect
    if getattr(dialect, _WATCHED, False):
        return
    rollback = dialect.do_rollback

    def do_rollback(dbapi_connection: Any) -> None:
        _forget_prepared(dbapi_connection)
        rollback(dbapi_connection)

    dialect.do_rollback = do_rollback  # type: ignore[method-assign]
    setattr(dialect, _WATCHED, True)
    event.listen(engine.pool, "reset", _on_reset)


def _forget_prepared(fairy: Any) -> None:
    """``fairy``: the pool's proxy of the DBAPI connection, about to be rolled back."""
    pgconn = getattr(fairy.driver_connection, "pgconn", None)
    if pgconn is None:
        return
    try:
        info = fairy.info
    except NotImplementedError:  # the ad-hoc proxy of an engine's very first connection: nothing prepared yet
        return
    pg_pipeline.forget_after_rollback(info, pgconn)


def _on_reset(dbapi_conn: Any, record: Any, state: Any) -> None:
    pgconn = getattr(dbapi_conn, "pgconn", None)
    if pgconn is not None and record is not None:
        pg_pipeline.forget_after_rollback(record.info, pgconn)
