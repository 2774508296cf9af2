"""``reliable stubs prune``: messages every group settled long ago leave the database; nothing owed does.

Nothing deleted a stub or an inbox row before: both tables grew for as long as a service ran.
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import delete, insert, select, update

from reliable import Reliability
from reliable.cli import main
from reliable.errors import ConfigurationError
from reliable.models import MessageInbox, MessageLog, MessageStub, StubNotification
from reliable.outbox.prune import prunable, prune_settled
from reliable.sweeper.selection import inbox, notif, stub
from reliable.types import StubStatus
from tests.conftest import _ensure_clean_schema
from tests.sweeper.helpers import T0, TOLD, add_inbox_without_stub, add_log, add_stub, clean, set_inbox

OLD = T0 - dt.timedelta(days=40)
BEFORE = T0 - dt.timedelta(days=30)


def _aged(rel: Reliability, message_id: str, when: dt.datetime) -> None:
    with rel.engine.begin() as conn:
        for table in (stub, inbox):
            conn.execute(update(table).where(table.c.message_id == message_id).values(updated_at=when))


def _ids(rel: Reliability, model: type[MessageStub] | type[MessageInbox] | type[MessageLog]) -> list[str]:
    with rel.engine.connect() as conn:
        return sorted(set(conn.execute(select(model.message_id)).scalars()))


def test_only_messages_every_group_settled_before_the_cut_are_pruned_with_their_rows(
    rel: Reliability,
) -> None:
    add_stub(rel, "done-old", groups=["billing", "audit"], status=StubStatus.CONFIRMED)
    add_stub(rel, "voided-old", status=StubStatus.VOIDED)
    add_stub(rel, "done-recent", status=StubStatus.CONFIRMED)
    add_stub(rel, "pending-old", status=StubStatus.PENDING)
    add_stub(rel, "dead-old", status=StubStatus.DEAD)
    # the stub says CONFIRMED, but one group's row is still owed (a repair the sweeper has not made yet)
    add_stub(rel, "half-old", groups=["billing", "audit"], status=StubStatus.CONFIRMED)
    set_inbox(rel, "half-old", "audit", status=StubStatus.PENDING)
    # the guard's inbox pattern: rows without a stub
    add_inbox_without_stub(rel, "lone-old", status=StubStatus.CONFIRMED)
    add_inbox_without_stub(rel, "lone-open", status=StubStatus.CONFIRMED)
    add_inbox_without_stub(rel, "lone-open", consumer_group="audit", status=StubStatus.PENDING)
    for mid in ("done-old", "voided-old", "pending-old", "dead-old", "half-old", "lone-old", "lone-open"):
        _aged(rel, mid, OLD)
    _aged(rel, "done-recent", T0 - dt.timedelta(days=2))
    for mid in ("done-old", "pending-old", "lone-old"):
        add_log(rel, mid, OLD)
    with rel.engine.begin() as conn:
        notice = {"message_id": "done-old", "consumer_group": "billing", "channel": "log", "reason": "x"}
        conn.execute(insert(notif).values(**notice, attempts=0, created_at=OLD))

    # a message is pruned once the log purge has taken its journal: until then only the voided one, which
    # was never delivered, has none
    assert prunable(rel.engine, before=BEFORE) == 1
    assert prune_settled(rel.engine, before=BEFORE) == 1
    assert "voided-old" not in _ids(rel, MessageStub)
    _purge_journal(rel, ["done-old", "lone-old"])  # the log purge, by age (it keeps evidence of owed rows)
    assert prunable(rel.engine, before=BEFORE) == 2
    assert prune_settled(rel.engine, before=BEFORE, batch=1) == 2
    kept = ["dead-old", "done-recent", "half-old", "pending-old"]
    assert _ids(rel, MessageStub) == kept
    assert _ids(rel, MessageInbox) == sorted([*kept, "lone-open"])
    assert _ids(rel, MessageLog) == ["pending-old"]  # the journal is the log purge's, never pruned here
    with rel.engine.connect() as conn:
        assert conn.execute(select(StubNotification.message_id).where(TOLD)).all() == []
    assert prune_settled(rel.engine, before=BEFORE) == 0


def _purge_journal(rel: Reliability, message_ids: list[str]) -> None:
    with rel.engine.begin() as conn:
        conn.execute(delete(MessageLog).where(MessageLog.message_id.in_(message_ids)))


def test_a_message_delivered_again_lately_is_not_pruned(rel: Reliability) -> None:
    """Settled 40 days ago, and a copy arrived today (an offset reset, a log not compacted yet): both groups
    answered it as a duplicate. Pruned with its old rows, the next copy was applied again in every group —
    and the report counted today's journal rows as deliveries of a message it did not know."""
    add_stub(rel, "again", groups=["billing", "audit"], status=StubStatus.CONFIRMED)
    _aged(rel, "again", OLD)
    for group in ("billing", "audit"):
        add_log(rel, "again", T0, consumer_group=group)  # today's duplicate; the guard leaves the row as is
    assert prunable(rel.engine, before=BEFORE) == 0
    assert prune_settled(rel.engine, before=BEFORE) == 0
    assert _ids(rel, MessageStub) == ["again"] and _ids(rel, MessageInbox) == ["again"]


def test_a_naive_cut_is_a_typed_error(rel: Reliability) -> None:
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        prune_settled(rel.engine, before=dt.datetime(2020, 1, 1))


def test_the_cli_asks_first_and_refuses_a_cut_inside_the_brokers_redelivery_horizon(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _ensure_clean_schema(sqlite_url)
    sqlite_rel = Reliability(sqlite_url, redis_url="")
    clean(sqlite_rel.engine)
    add_stub(sqlite_rel, "done-old", status=StubStatus.CONFIRMED)
    _aged(sqlite_rel, "done-old", dt.datetime.now(dt.UTC) - dt.timedelta(days=40))
    assert main(["stubs", "prune", "--older-than", "30d", "--db", sqlite_url]) == 0
    assert "1 settled message(s)" in capsys.readouterr().out and _ids(sqlite_rel, MessageStub) == ["done-old"]
    assert main(["stubs", "prune", "--older-than", "1d", "--yes", "--db", sqlite_url]) == 2
    assert "between 7 days" in capsys.readouterr().err and _ids(sqlite_rel, MessageStub) == ["done-old"]
    assert main(["stubs", "prune", "--older-than", "30d", "--yes", "--db", sqlite_url]) == 0
    assert "pruned 1" in capsys.readouterr().out and _ids(sqlite_rel, MessageStub) == []
    sqlite_rel.close()


def test_a_group_that_claimed_its_own_row_lately_keeps_the_message(rel: Reliability) -> None:
    """A group the producer did not list (added to topic_groups later) claims a row of its own when its
    copy arrives, long after the stub settled; the stub stays old. That row is the group's deduplication:
    pruned with the old stub, the next copy was applied a second time."""
    add_stub(rel, "late", status=StubStatus.CONFIRMED)
    _aged(rel, "late", OLD)
    with rel.engine.begin() as conn:
        conn.execute(
            insert(inbox).values(
                consumer_group="search", message_id="late", status=StubStatus.CONFIRMED, attempts=0,
                resend_count=0, created_at=T0, updated_at=T0,
            )
        )  # fmt: skip
    assert prunable(rel.engine, before=BEFORE) == 0
    assert prune_settled(rel.engine, before=BEFORE) == 0
    assert _ids(rel, MessageInbox) == ["late"] and _ids(rel, MessageStub) == ["late"]


@pytest.mark.parametrize("days", [-1, 0, 1, 6.9])
def test_the_library_refuses_a_cut_inside_the_redelivery_horizon_too(rel: Reliability, days: float) -> None:
    """Only the CLI refused it: ``prune_settled(before=now + 1 h)`` deleted a message confirmed a second
    ago, and its redelivery was applied again."""
    cut = dt.datetime.now(dt.UTC) - dt.timedelta(days=days)
    with pytest.raises(ConfigurationError, match="less than 7 days ago"):
        prune_settled(rel.engine, before=cut)
    with pytest.raises(ConfigurationError):
        prunable(rel.engine, before=cut)
