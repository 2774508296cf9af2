"""Migration 0008 (MySQL/MariaDB): message ids, groups and topics compare exactly, as on PostgreSQL and
SQLite.

What a user needs: ids that differ only in case, accents or trailing spaces are different messages on every
backend — staged, processed and confirmed once each. Before 0008, MariaDB's default collation made them one
key: the producer refused the second, and the guard answered its deliveries ``confirm_conflict`` for ever.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from alembic.script import ScriptDirectory
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, func, inspect, select, text

from reliable import Reason, Reliability, StubProducer, idempotent_consumer
from reliable.cli import main
from reliable.errors import InvalidMessageError, MigrationRefusedError
from reliable.migrate import alembic_config, current, downgrade, upgrade
from reliable.models import MessageStub
from tests import services
from tests.core.guard_helpers import apply, env, ledger, make_rel
from tests.migration_support import engine_for
from tests.sweeper.helpers import QueueSender

#: one id and its look-alikes under a case-, accent- and pad-insensitive collation
IDS = ["Ord-aB", "ord-Ab", "ORD-AB", "Ord-aB ", "Örd-aB"]
HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()


def effects(rel: Reliability) -> dict[str, int]:
    """Applications per id, told apart in Python (the test's own ledger table has the default collation)."""
    with rel.engine.connect() as conn:
        return dict(Counter(conn.execute(select(ledger.c.message_id)).scalars()))


def test_ids_differing_only_in_case_accents_or_trailing_spaces_are_different_messages(
    db_url: str, key_prefix: str
) -> None:
    rel = make_rel(db_url, "", key_prefix)
    try:
        producer = StubProducer(rel, QueueSender(), default_group="g")
        staged = [m for m in IDS if not m.endswith(" ")]
        for message_id in staged:
            producer.publish(message_id, "orders", b"{}")
        # reliable's producer refuses whitespace in an id (RocketMQ's KEYS would split it); another
        # producer's message with one still reaches the guard, which keeps it apart (its inbox row)
        with pytest.raises(InvalidMessageError, match="whitespace"):
            producer.publish("Ord-aB ", "orders", b"{}")
        handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(apply)
        assert [handle.decide(env(m)).reason for m in IDS] == [Reason.PROCESSED] * len(IDS)
        assert [handle.decide(env(m)).reason for m in IDS] == [Reason.DUPLICATE_CONFIRMED] * len(IDS)
        assert effects(rel) == dict.fromkeys(IDS, 1)
        with rel.engine.connect() as conn:
            confirmed = conn.execute(
                select(func.count()).select_from(MessageStub).where(MessageStub.status == "CONFIRMED")
            ).scalar_one()
        assert confirmed == len(staged)
    finally:
        rel.close()


@pytest.fixture
def engine() -> Iterator[Engine]:
    with services.scratch_database("mariadb") as url, engine_for(url) as eng:
        yield eng


def _collations(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT DISTINCT collation_name FROM information_schema.columns"
                " WHERE table_schema = DATABASE()"
                " AND table_name NOT IN ('alembic_version', 'reliable_alembic_version')"
                " AND collation_name IS NOT NULL"
            )
        ).scalars()
        return set(rows)


def test_0008_gives_every_text_column_an_exact_collation_and_takes_it_back(engine: Engine) -> None:
    upgrade(engine, "0007")
    with engine.connect() as conn:
        default = conn.execute(
            text(
                "SELECT default_collation_name FROM information_schema.schemata"
                " WHERE schema_name = DATABASE()"
            )
        ).scalar_one()
    assert _collations(engine) == {default}
    upgrade(engine)
    assert _collations(engine) == {"utf8mb4_nopad_bin"}
    downgrade(engine, "0007")
    assert _collations(engine) == {default}
    upgrade(engine)
    assert _collations(engine) == {"utf8mb4_nopad_bin"}


def _inbox_row(engine: Engine, message_id: str, last_error: str | None = None) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO message_inbox (consumer_group, message_id, status, attempts, resend_count,"
                " created_at, updated_at, broker_name, last_error)"
                " VALUES ('g', :m, 'DEAD', 0, 0, NOW(6), NOW(6), '', :e)"
            ),
            {"m": message_id, "e": last_error},
        )


def _untouched(engine: Engine) -> None:
    """Still at head: every column still exact, 0009's column still there (its step runs first)."""
    assert current(engine) == HEAD
    assert _collations(engine) == {"utf8mb4_nopad_bin"}
    assert "properties" in {c["name"] for c in inspect(engine).get_columns("message_stub")}


def test_a_downgrade_that_would_merge_two_ids_is_refused_before_any_change(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two ids differing only in case are one key under the default collation: the downgrade converted
    message_stub, then failed (duplicate key) on message_inbox — mixed collations, revision still 0008, and
    `db upgrade` never repaired it. Refused now, naming the rows, before 0009's step or any conversion."""
    upgrade(engine)
    _inbox_row(engine, "Ord-aB")
    _inbox_row(engine, "ord-Ab")
    with pytest.raises(MigrationRefusedError, match=r"\(g, Ord-aB\) and \(g, ord-Ab\)"):
        downgrade(engine, "0007")
    _untouched(engine)
    url = engine.url.render_as_string(hide_password=False)
    assert main(["db", "downgrade", "base", "--yes", "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "message_inbox" in err and "nothing was changed" in err
    _untouched(engine)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM message_inbox WHERE message_id = 'ord-Ab'"))
    downgrade(engine, "0007")
    assert current(engine) == "0007"


def test_a_downgrade_to_a_latin1_default_with_text_latin1_cannot_hold_is_refused(engine: Engine) -> None:
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text(f"ALTER DATABASE `{engine.url.database}` CHARACTER SET latin1"))
    _inbox_row(engine, "m1", "handler_failed: Zahlung für Kunde \N{GRINNING FACE} abgelehnt")
    _inbox_row(engine, "m2", "für")  # latin1 holds this one
    with pytest.raises(
        MigrationRefusedError, match=r"last_error of the rows .* = \(g, m1\) holds text latin1"
    ):
        downgrade(engine, "0007")
    _untouched(engine)


def test_a_downgrade_by_a_relative_or_unknown_revision_is_alembics_own_answer(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    upgrade(engine)
    url = engine.url.render_as_string(hide_password=False)
    assert main(["db", "downgrade", "nope", "--yes", "--db", url]) == 2
    assert "Can't locate revision identified by 'nope'" in capsys.readouterr().err
    steps = int(str(HEAD)) - 7  # from the head through 0008: checked, nothing in the way
    downgrade(engine, f"-{steps}")
    assert current(engine) == "0007"
