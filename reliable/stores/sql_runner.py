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

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from reliable.stores.sql_text import ts_converter


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
        fairy = conn.connection
        cur = fairy.cursor()
        try:
            if many:
                cur.executemany(sql, params)
            else:
                cur.execute(sql, params)
            return cur.fetchall() if fetch else cur.rowcount
        except self._dbapi_error as exc:
            disconnect = self.engine.dialect.is_disconnect(cast(Any, exc), fairy.dbapi_connection, cur)
            if disconnect:
                conn.invalidate(exc)
            raise DBAPIError.instance(
                sql,
                params,
                exc,
                self._dbapi_error,
                connection_invalidated=disconnect,
                dialect=self.engine.dialect,
            ) from exc
        finally:
            cur.close()

    def all(self, conn: Connection, sql: str, params: Any) -> list[Any]:
        rows: list[Any] = self._cursor_call(conn, sql, params, False, True)
        return rows

    def run(self, conn: Connection, sql: str, params: Any, *, many: bool = False) -> int:
        return int(self._cursor_call(conn, sql, params, many, False))

    def execute(self, conn: Connection, sql: str) -> None:
        """A parameterless statement (e.g. ``SET TRANSACTION …``) through the same lean path."""
        self._cursor_call(conn, sql, (), False, False)

    def autocommit(self, conn: Connection, on: bool) -> None:
        """Switch the DBAPI connection's autocommit (PostgreSQL journal); only outside a transaction."""
        # dbapi_connection, not driver_connection: under the asyncio engine it is SQLAlchemy's adapter, which
        # awaits psycopg's set_autocommit (the async driver object refuses the plain assignment)
        conn.connection.dbapi_connection.autocommit = on  # type: ignore[union-attr]
