"""Translating a SQLAlchemy URL and a time window into Spark JDBC terms (no Spark needed, so the CLI can
check its input before paying for a Spark start-up)."""

from __future__ import annotations

import datetime as dt
import itertools
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


#: columns read in ranges, and whether they hold time (``created_at``) or whole numbers (``id``)
TIME_COLUMNS = frozenset({"created_at", "received_at", "stub_created_at"})
_TEXT_FMT = "%Y-%m-%d %H:%M:%S.%f"


def range_bounds_sql(column: str, dialect: str) -> tuple[str, str]:
    """SQL for the min and max of ``column``; times come back as UTC text (no driver or JVM zone applies)."""
    if column not in TIME_COLUMNS:
        return f"MIN({column})", f"MAX({column})"
    if dialect == "postgresql":
        fmt = "'YYYY-MM-DD HH24:MI:SS.US'"
        return (
            f"to_char(MIN({column}) AT TIME ZONE 'UTC', {fmt})",
            f"to_char(MAX({column}) AT TIME ZONE 'UTC', {fmt})",
        )
    fmt = "'%Y-%m-%d %H:%i:%s.%f'"
    return f"DATE_FORMAT(MIN({column}), {fmt})", f"DATE_FORMAT(MAX({column}), {fmt})"


def range_predicates(column: str, lo: object, hi: object, parts: int, dialect: str) -> list[str]:
    """``parts`` WHERE clauses that together select every row exactly once (open-ended at both ends)."""
    if column in TIME_COLUMNS:
        start = dt.datetime.strptime(str(lo), _TEXT_FMT).replace(tzinfo=dt.UTC)
        end = dt.datetime.strptime(str(hi), _TEXT_FMT).replace(tzinfo=dt.UTC)
        step = (end - start) / parts
        edges = sorted({start + step * i for i in range(1, parts)})
        literals = [_sql_ts(e, dialect) for e in edges if start < e <= end]
    else:
        a, b = int(str(lo)), int(str(hi))
        cuts = {a + (b - a) * i // parts for i in range(1, parts)}
        literals = [str(c) for c in sorted(cuts) if a < c]
    if not literals:
        return ["1=1"]
    preds = [f"({column} < {literals[0]} OR {column} IS NULL)"]
    preds += [f"{column} >= {x} AND {column} < {y}" for x, y in itertools.pairwise(literals)]
    preds.append(f"{column} >= {literals[-1]}")
    return preds
