"""The sweeper's ``(consumer_group, message_id) IN (…)`` (``claim.columns_in``) on every backend.

It picks a batch's inbox rows for the claim, the lock read before a record, and the owed-notice keys. It must
match exactly the pairs given — never a pair made of one key's group and another key's id — and on
PostgreSQL its statement must not grow with the batch: a statement of one bind per key cost the claim a
fifth of the sweeper's rate (docs/benchmarks/sweeper.md), and a text that changes with the batch's size is a
new entry in SQLAlchemy's compiled-statement cache every round.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql

from reliable import Reliability
from reliable.sweeper.claim import pair_in
from reliable.sweeper.selection import inbox
from reliable.types import StubStatus
from tests.sweeper.helpers import add_stub, get_inbox


@pytest.mark.parametrize(
    "wanted",
    [
        [("billing", "m0"), ("audit", "m1"), ("billing", "m3")],  # fewer groups than ids
        [("billing", "m2"), ("audit", "m2"), ("ops", "m2"), ("ops", "m0")],  # fewer ids than groups
    ],
)
def test_it_matches_exactly_the_pairs_given_never_a_cross_pair(
    rel: Reliability, wanted: list[tuple[str, str]]
) -> None:
    for n in range(4):
        add_stub(rel, f"m{n}", groups=["billing", "audit", "ops"])
    with rel.engine.begin() as conn:
        rows = conn.execute(select(inbox.c.consumer_group, inbox.c.message_id).where(pair_in(conn, wanted)))
        assert sorted(tuple(r) for r in rows) == sorted(wanted)  # no pair of one key's group, another's id
        changed = conn.execute(update(inbox).where(pair_in(conn, wanted)).values(status=StubStatus.VOIDED))
        assert changed.rowcount == len(wanted)
    for n in range(4):
        for group in ("billing", "audit", "ops"):
            voided = get_inbox(rel, f"m{n}", group).status is StubStatus.VOIDED
            assert voided is ((group, f"m{n}") in wanted)


def test_a_batch_of_no_key_matches_nothing(rel: Reliability) -> None:
    add_stub(rel, "m0")
    with rel.engine.begin() as conn:
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
