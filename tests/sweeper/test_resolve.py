"""What a person does after the sweeper gave up (reliable.sweeper.resolve), on every backend: void one group's
row and let the message go on for the others, cancel a message, close a row whose stub is gone, retire a
group that no longer consumes — all or nothing, notices forgotten, and the sweeper and the guard leaving the
closed rows alone."""

from __future__ import annotations

import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from reliable import ConsumeResult, Envelope, Reason, Reliability, idempotent_consumer
from reliable.errors import InvalidStubStateError, StubNotFoundError
from reliable.sweeper import FixedBackoff, Sweeper, retire_group, void
from reliable.sweeper.selection import inbox, notif
from reliable.types import StubStatus
from tests.core.guard_helpers import env
from tests.sweeper.helpers import (
    T0,
    Clock,
    QueueSender,
    add_inbox_without_stub,
    add_stub,
    get_inbox,
    get_stub,
    set_inbox,
    set_progress,
)


def owe_notice(rel: Reliability, message_id: str, group: str) -> None:
    with rel.engine.begin() as conn:
        conn.execute(
            insert(notif),
            [
                {
                    "message_id": message_id,
                    "consumer_group": group,
                    "channel": "log",
                    "reason": "DEAD: never received",
                    "attempts": 1,
                    "created_at": T0,
                }
            ],
        )


def notices(rel: Reliability) -> set[tuple[str, str]]:
    t = notif
    with rel.engine.connect() as conn:
        return {
            (r.message_id, r.consumer_group) for r in conn.execute(select(t.c.message_id, t.c.consumer_group))
        }


def sweep(rel: Reliability, sender: QueueSender, clock: Clock) -> int:
    return Sweeper(rel, sender, backoff=FixedBackoff((10.0,)), clock=clock).run_once().resent


def test_voiding_one_groups_dead_row_settles_the_message_for_the_others(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    add_stub(rel, "m", groups=["billing", "audit"], status=StubStatus.DEAD, queue_offset=5)
    set_inbox(rel, "m", "billing", status=StubStatus.CONFIRMED, resend_at=None)
    owe_notice(rel, "m", "audit")
    assert get_stub(rel, "m").status is StubStatus.DEAD
    assert void(rel.engine, ["m"], now=T0, group="audit") == 1
    assert get_inbox(rel, "m", "audit").status is StubStatus.VOIDED
    assert get_inbox(rel, "m", "billing").status is StubStatus.CONFIRMED
    assert get_stub(rel, "m").status is StubStatus.CONFIRMED  # nothing is owed any more
    assert notices(rel) == set()
    set_progress(rel, 9, group="audit")  # would be "overtaken" if the row were still open
    assert sweep(rel, sender, clock) == 0


def test_voiding_a_group_row_leaves_the_message_open_for_a_group_still_owed(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    add_stub(rel, "m", groups=["billing", "audit"], queue_offset=5)
    set_inbox(rel, "m", "audit", status=StubStatus.DEAD, resend_at=None)
    assert void(rel.engine, ["m"], now=T0, group="audit") == 1
    assert get_stub(rel, "m").status is StubStatus.PENDING  # billing still owes it
    set_progress(rel, 9, group="billing")
    set_progress(rel, 9, group="audit")
    assert sweep(rel, sender, clock) == 1
    assert [m.target_group for m in sender.sent] == ["billing"]


def test_voiding_without_a_group_cancels_the_message_all_or_nothing(rel: Reliability) -> None:
    add_stub(rel, "dead", groups=["billing", "audit"], status=StubStatus.DEAD)
    add_stub(rel, "done", status=StubStatus.CONFIRMED)
    owe_notice(rel, "dead", "billing")
    with pytest.raises(InvalidStubStateError, match="no such row for: done"):
        void(rel.engine, ["dead", "done"], now=T0)
    with pytest.raises(StubNotFoundError, match="no such message: nope"):
        void(rel.engine, ["dead", "nope"], now=T0)
    with pytest.raises(InvalidStubStateError, match="of group audit for: done"):
        void(rel.engine, ["done"], now=T0, group="audit")
    assert get_inbox(rel, "dead", "audit").status is StubStatus.DEAD  # nothing changed
    assert notices(rel) == {("dead", "billing")}
    assert void(rel.engine, ["dead"], now=T0) == 2
    assert get_stub(rel, "dead").status is StubStatus.VOIDED
    assert {get_inbox(rel, "dead", g).status for g in ("billing", "audit")} == {StubStatus.VOIDED}
    assert notices(rel) == set()


def test_a_row_whose_stub_is_gone_can_be_closed(rel: Reliability) -> None:
    """Revive cannot help such a row (nothing to re-send); void closes it."""
    add_inbox_without_stub(rel, "orphan", status=StubStatus.DEAD)
    assert void(rel.engine, ["orphan"], now=T0, group="billing") == 1
    assert get_inbox(rel, "orphan").status is StubStatus.VOIDED


def test_a_voided_groups_delivery_is_acknowledged_without_the_handler(rel: Reliability) -> None:
    add_stub(rel, "late", groups=["billing", "audit"])
    assert void(rel.engine, ["late"], now=T0, group="audit") == 1
    ran: list[str] = []

    def handler(e: Envelope, session: Session) -> None:
        ran.append(e.message_id or "")

    for group in ("audit", "billing"):
        handle = idempotent_consumer(rel, group=group)(handler)
        decision = handle.decide(env("late", b"body-late"))
        assert decision.result is ConsumeResult.SUCCESS
        if group == "audit":
            assert decision.reason is Reason.VOIDED
    assert ran == ["late"]  # billing's only
    assert get_stub(rel, "late").status is StubStatus.CONFIRMED


def test_retiring_a_group_voids_every_open_row_of_it_in_batches(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    for i in range(5):
        add_stub(rel, f"r{i}", groups=["billing", "old"], queue_offset=i)
        set_inbox(rel, f"r{i}", "billing", status=StubStatus.CONFIRMED, resend_at=None)
    set_inbox(rel, "r3", "old", status=StubStatus.DEAD, resend_at=None)
    owe_notice(rel, "r3", "old")
    add_stub(rel, "kept", groups=["billing", "old"], queue_offset=7)  # billing still owes this one
    add_stub(rel, "done", groups=["old"], status=StubStatus.CONFIRMED)
    add_stub(rel, "other", groups=["billing"], status=StubStatus.DEAD)
    owe_notice(rel, "other", "billing")

    assert retire_group(rel.engine, "old", now=T0, batch=2) == 6
    with rel.engine.connect() as conn:
        by_status = {
            StubStatus(status): int(n)
            for status, n in conn.execute(
                select(inbox.c.status, func.count())
                .where(inbox.c.consumer_group == "old")
                .group_by(inbox.c.status)
            )
        }
    assert by_status == {StubStatus.VOIDED: 6, StubStatus.CONFIRMED: 1}
    assert {get_stub(rel, f"r{i}").status for i in range(5)} == {StubStatus.CONFIRMED}
    assert get_stub(rel, "kept").status is StubStatus.PENDING
    assert get_inbox(rel, "other", "billing").status is StubStatus.DEAD  # another group's row untouched
    assert notices(rel) == {("other", "billing")}
    assert retire_group(rel.engine, "old", now=T0, batch=2) == 0
    set_progress(rel, 9, group="old")
    set_progress(rel, 9, group="billing")
    assert sweep(rel, sender, clock) == 1
    assert [(m.message_id, m.target_group) for m in sender.sent] == [("kept", "billing")]
