"""The sweeper's ``(consumer_group, message_id) IN (…)`` (``claim.columns_in``) on every backend.

It picks a batch's inbox rows for the claim, the lock read before a record, and the owed-notice keys. It must
match exactly the pairs given — never a pair made of one key's group and another key's id — and on
PostgreSQL its statement must not grow with the batch: a statement of one bind per key cost the claim a
fifth of the sweeper's rate (docs/benchmarks/sweeper.md), and a text that changes with the batch's size is a
new entry in SQLAlchemy's compiled-statement cache every round.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql

from reliable import Reliability
from reliable.sweeper.claim import pair_in
from reliable.sweeper.selection import inbox
from reliable.types import StubStatus
from tests.sweeper.helpers import add_stub, get_inbox


def test_it_matches_exactly_the_pairs_given_never_a_cross_pair(rel: Reliability) -> None:
    for n in range(4):
        add_stub(rel, f"m{n}", groups=["billing", "audit"])
    wanted = [("billing", "m0"), ("audit", "m1"), ("billing", "m3")]
    with rel.engine.begin() as conn:
        rows = conn.execute(select(inbox.c.consumer_group, inbox.c.message_id).where(pair_in(conn, wanted)))
        assert sorted(tuple(r) for r in rows) == sorted(wanted)  # not (audit, m0), (billing, m1), (audit, m3)
        changed = conn.execute(update(inbox).where(pair_in(conn, wanted)).values(status=StubStatus.VOIDED))
        assert changed.rowcount == 3
    assert get_inbox(rel, "m1", "audit").status is StubStatus.VOIDED
    assert get_inbox(rel, "m1", "billing").status is StubStatus.PENDING


def test_a_batch_of_no_key_matches_nothing(rel: Reliability) -> None:
    add_stub(rel, "m0")
    with rel.engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            return  # an OR of no pairs is SQLAlchemy's "false"; the callers never pass an empty batch there
        assert conn.execute(select(inbox.c.message_id).where(pair_in(conn, []))).all() == []


class _PgConn:
    """What ``columns_in`` looks at on a connection: its dialect (compiling needs no server)."""

    dialect = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]


def test_on_postgresql_the_statement_is_the_same_for_any_batch_size() -> None:
    def compiled(n: int) -> tuple[str, int]:
        keys = [(f"g{i % 3}", f"m{i}") for i in range(n)]
        stmt = select(inbox.c.message_id).where(pair_in(_PgConn(), keys))  # type: ignore[arg-type]
        c = stmt.compile(dialect=_PgConn.dialect)
        return str(c), len(c.params)

    small, large = compiled(2), compiled(1000)
    assert small == large
    assert small[1] == 2  # two arrays, whatever the batch
