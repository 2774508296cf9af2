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
from tests.sweeper.test_race import short_lock_wait


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


def test_a_lock_read_of_one_key_locks_that_row_only(rel: Reliability) -> None:
    """A sweeper batch of one row (a claim, the record's lock read, a give-up) must not hold up consumers
    and producers working on other rows. MariaDB planned a one-pair row-value ``IN`` as a scan of the whole
    primary key: at REPEATABLE READ it locked every inbox row and the gaps between them, so a consumer
    locking another message's row, or a producer staging a new one, waited for the sweeper's transaction
    (and the sweeper waited for any consumer holding a row)."""
    for n in range(3):
        add_stub(rel, f"m{n}")
    with rel.engine.connect() as sweeper, rel.engine.connect() as other:
        if sweeper.dialect.name == "sqlite":
            return  # one writer at a time: the database lock, no row locks
        tx = sweeper.begin()
        key = pair_in(sweeper, [("billing", "m1")])
        assert sweeper.execute(select(inbox.c.message_id).where(key).with_for_update()).scalars().all() == [
            "m1"
        ]
        assert sweeper.execute(update(inbox).where(key).values(attempts=0)).rowcount == 1
        with other.begin():
            short_lock_wait(other)  # a wait fails in 2 s instead of hanging
            locked = select(inbox.c.message_id).where(inbox.c.message_id.in_(["m0", "m2"])).with_for_update()
            assert other.execute(locked).scalars().all() == ["m0", "m2"]  # a consumer's rows
        add_stub(rel, "m3")  # a producer staging a new message
        tx.rollback()
