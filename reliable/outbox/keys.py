"""``(a, b) IN (…)`` over a batch of key pairs, in the shape each backend handles best.

The sweeper and the outbox address rows by two-column keys — an inbox row by ``(consumer_group,
message_id)``, a notice by ``(message_id, consumer_group)`` — a batch of up to a few hundred at a time. Bound
one parameter per key, such a list makes a statement of 1 000 binds whose text changes with the batch's size
(a new entry in SQLAlchemy's compiled-statement cache every round); an OR of pairs took SQLAlchemy ~30 ms to
build and compile for 500. One helper, so every caller gets the same shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, String, and_, bindparam, func, or_, select, tuple_
from sqlalchemy.dialects import postgresql

#: the key arrays' type: ``varchar[]``, the key columns' own, so the primary key's index is used as is
_TEXT_ARRAY = postgresql.ARRAY(String)


def columns_in(
    conn: Connection, first: ColumnElement[Any], second: ColumnElement[Any], keys: Sequence[tuple[str, str]]
) -> ColumnElement[bool]:
    """``(first, second) IN (…)`` for ``keys``, in the shape each backend handles best:

    * PostgreSQL: ``IN (SELECT … FROM unnest(:a, :b))`` — two array parameters whatever the batch's size, so
      the statement's text, and SQLAlchemy's compiled-statement cache entry, are the same for every batch
      (bound one by one, the claim's pairs cost it a fifth of c1's rate; docs/benchmarks/sweeper.md);
    * MariaDB / MySQL: a row-value ``IN`` list (no array type) — for one key two equalities: MariaDB
      plans ``(a, b) IN ((x, y))`` as a scan of the whole index (it makes a range of two pairs or more, not
      of one), so a one-row claim or lock read at REPEATABLE READ locked every inbox row of the table: it
      waited for any consumer holding one and held up every consumer and producer until it committed;
    * SQLite: an OR of pairs, as row values do not work through every driver.
    """
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
    if len(keys) == 1:
        return and_(first == keys[0][0], second == keys[0][1])
    return tuple_(first, second).in_(list(keys))
