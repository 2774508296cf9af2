"""``(a, b) IN (…)`` over a batch of key pairs, in the shape each backend handles best.

The sweeper and the outbox address rows by two-column keys — an inbox row by ``(consumer_group,
message_id)``, a notice by ``(message_id, consumer_group)`` — a batch of up to a few hundred at a time. Bound
one parameter per key, such a list makes a statement of 1 000 binds whose text changes with the batch's size
(a new entry in SQLAlchemy's compiled-statement cache every round); an OR of pairs took SQLAlchemy ~30 ms to
build and compile for 500. One helper, so every caller gets the same shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, TypeVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    String,
    Table,
    Update,
    and_,
    bindparam,
    false,
    func,
    or_,
    select,
    tuple_,
)
from sqlalchemy.dialects import postgresql

#: the key arrays' type: ``varchar[]``, the key columns' own, so the primary key's index is used as is
_TEXT_ARRAY = postgresql.ARRAY(String)

#: MariaDB/MySQL's hint: read the table through its primary key (:func:`by_primary_key`); the guard's own
#: SQL text carries the same words (:data:`reliable.stores.sql_text.PK_ORDER`)
PRIMARY_KEY_HINT: Final = "FORCE INDEX (PRIMARY)"

_Stmt = TypeVar("_Stmt", Select[Any], Update)


def by_primary_key(stmt: _Stmt, table: Table) -> _Stmt:
    """``stmt`` told to read ``table`` through its primary key on MariaDB/MySQL (SQLAlchemy renders the hint
    for the dialect name it was given, and a pymysql engine on MariaDB is named ``mariadb``: both).

    Why: InnoDB locks rows in the order of the index it reads. ``message_inbox``'s key is ``(consumer_group,
    message_id)``; read through its ``(message_id, status)`` index a locking statement locks each row's
    entry there, then the row. A guard locks its group's rows by primary key (``SELECT … FOR UPDATE``) and
    then, its ``UPDATE`` of ``status`` moving each row in that index, the entry: the reverse order, a
    deadlock. Every locking statement of the guard and the sweeper on inbox rows it can address by key
    goes through here (or through ``PK_ORDER``), so all of them lock rows only, in key order. Only for a
    statement with the key's both columns in its ``WHERE`` (:func:`columns_in`, or a group and its ids):
    forced onto the primary key, one with ids alone would scan the table."""
    for dialect in ("mysql", "mariadb"):
        if isinstance(stmt, Select):
            stmt = stmt.with_hint(table, PRIMARY_KEY_HINT, dialect_name=dialect)
        else:
            stmt = stmt.with_hint(PRIMARY_KEY_HINT, dialect_name=dialect)
    return stmt


def columns_in(
    conn: Connection, first: ColumnElement[Any], second: ColumnElement[Any], keys: Sequence[tuple[str, str]]
) -> ColumnElement[bool]:
    """``(first, second) IN (…)`` for ``keys``, in the shape each backend handles best:

    * PostgreSQL: ``IN (SELECT … FROM unnest(:a, :b))`` — two array parameters whatever the batch's size, so
      the statement's text, and SQLAlchemy's compiled-statement cache entry, are the same for every batch
      (bound one by one, the claim's pairs cost it a fifth of c1's rate; docs/benchmarks/sweeper.md);
    * MariaDB / MySQL: ``(first = :a AND second IN (…)) OR …``, one term per distinct value of whichever
      column has fewer (a batch has a few groups): MariaDB 10.11's range optimizer spends ~0.3 s on a
      row-value ``IN`` of 500 pairs before it reads a row (``EXPLAIN`` alone takes as long), against 3 ms
      for a scalar ``IN`` of 500 under one equality; and a row-value ``IN`` of one pair it plans as a scan of
      the whole index, so a one-row lock read at REPEATABLE READ locked every inbox row of the table;
    * SQLite: an OR of pairs, as row values do not work through every driver.
    """
    if not keys:
        return false()
    if conn.dialect.name == "postgresql":
        pairs = (
            func.unnest(
                bindparam(None, [a for a, _ in keys], type_=_TEXT_ARRAY),
                bindparam(None, [b for _, b in keys], type_=_TEXT_ARRAY),
            )
            .table_valued("a", "b")
            .render_derived(name="k")
        )
        return tuple_(first, second).in_(select(pairs.c.a, pairs.c.b))
    if conn.dialect.name == "sqlite":
        return or_(*[and_(first == a, second == b) for a, b in keys])
    return _grouped_in(first, second, keys)


def _grouped_in(
    first: ColumnElement[Any], second: ColumnElement[Any], keys: Sequence[tuple[str, str]]
) -> ColumnElement[bool]:
    by_first: dict[str, list[str]] = {}
    by_second: dict[str, list[str]] = {}
    for a, b in keys:
        by_first.setdefault(a, []).append(b)
        by_second.setdefault(b, []).append(a)
    if len(by_second) < len(by_first):
        return or_(*[and_(second == b, first.in_(sorted(a))) for b, a in sorted(by_second.items())])
    return or_(*[and_(first == a, second.in_(sorted(b))) for a, b in sorted(by_first.items())])
