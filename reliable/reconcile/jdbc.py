"""Translating a SQLAlchemy URL and a time window into Spark JDBC terms (no Spark needed, so the CLI can
check its input before paying for a Spark start-up)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from reliable.reconcile.errors import InputError


@dataclass(frozen=True)
class JdbcTarget:
    """A SQLAlchemy URL translated for Spark's JDBC source."""

    url: str
    driver: str
    properties: dict[str, str]
    dialect: str  # "postgresql" | "mysql"


def jdbc_target(db_url: str) -> JdbcTarget:
    """``postgresql+psycopg://u:p@h:5432/db`` → ``jdbc:postgresql://h:5432/db`` (+ user/password)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        u = make_url(db_url)
    except ArgumentError as exc:
        raise InputError(f"not a database URL: {db_url!r}") from exc
    backend = u.get_backend_name()
    props: dict[str, str] = {}
    if u.username:
        props["user"] = u.username
    if u.password:
        props["password"] = str(u.password)
    host = u.host or "127.0.0.1"
    if backend == "postgresql":
        return JdbcTarget(
            f"jdbc:postgresql://{host}:{u.port or 5432}/{u.database}",
            "org.postgresql.Driver",
            props,
            "postgresql",
        )
    if backend in ("mysql", "mariadb"):
        # the mysql scheme (which the MariaDB driver accepts) makes Spark pick its MySQL dialect: backtick
        # quoting; under jdbc:mariadb: Spark falls back to ANSI double quotes, which MariaDB reads as strings
        return JdbcTarget(
            f"jdbc:mysql://{host}:{u.port or 3306}/{u.database}?permitMysqlScheme",
            "org.mariadb.jdbc.Driver",
            props,
            "mysql",
        )
    if backend == "sqlite":
        raise InputError(
            "SQLite is read through Parquet: run `reliable export --to DIR` first "
            "(`reliable reconcile` does that for you)"
        )
    raise InputError(f"unsupported database for JDBC: {backend}")


def _sql_ts(value: dt.datetime, dialect: str) -> str:
    """A timestamp literal: ``timestamptz`` on PostgreSQL, naive UTC ``DATETIME`` on MariaDB (models.py)."""
    text = value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return f"TIMESTAMPTZ '{text}+00'" if dialect == "postgresql" else f"'{text}'"


def window_sql(column: str, since: dt.datetime | None, until: dt.datetime | None, dialect: str) -> str:
    conds = []
    if since is not None:
        conds.append(f"{column} >= {_sql_ts(since, dialect)}")
    if until is not None:
        conds.append(f"{column} < {_sql_ts(until, dialect)}")
    return " AND ".join(conds) or "1=1"
