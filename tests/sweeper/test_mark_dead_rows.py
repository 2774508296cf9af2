"""A round's give-ups set DEAD in one batch (``outbox.mark_dead_rows``): exactly the rows still PENDING.

The sweeper gives up a batch at a time — after a long outage thousands of rows at once, each a notice a
person must get. A row confirmed, voided or already given up meanwhile must stay as it is and get no notice
(the caller tells only the rows returned); each row keeps its own reason; the stub's status is derived once.
"""

from __future__ import annotations

import datetime as dt

from reliable import Reliability, outbox
from reliable.models import MessageStub
from reliable.types import StubStatus
from tests.sweeper.helpers import T0, add_stub, get_inbox


def _stub_status(rel: Reliability, message_id: str) -> StubStatus:
    with rel.session() as s:
        row = s.get(MessageStub, message_id)
        assert row is not None
        return StubStatus(row.status)


def test_only_rows_still_pending_go_dead_each_with_its_own_reason(rel: Reliability) -> None:
    add_stub(rel, "m1", groups=["billing", "audit"])
    add_stub(rel, "m2", groups=["billing"], status=StubStatus.CONFIRMED)
    add_stub(rel, "m3", groups=["billing"], status=StubStatus.VOIDED)
    add_stub(rel, "m4", groups=["billing"])
    now = T0 + dt.timedelta(hours=1)
    batch = [
        ("m4", "billing", "DEAD: four"),
        ("m1", "billing", "DEAD: one"),
        ("m2", "billing", "DEAD: confirmed meanwhile"),
        ("m3", "billing", "DEAD: voided meanwhile"),
        ("m9", "billing", "DEAD: no such row"),
    ]
    with rel.engine.begin() as conn:
        changed = outbox.mark_dead_rows(conn, batch, now)
    assert changed == {("m1", "billing"), ("m4", "billing")}
    m1, m4 = get_inbox(rel, "m1"), get_inbox(rel, "m4")
    assert (m1.status, m1.last_error, m1.resend_at) == (StubStatus.DEAD, "DEAD: one", None)
    assert (m4.status, m4.last_error) == (StubStatus.DEAD, "DEAD: four")
    assert get_inbox(rel, "m1", "audit").status is StubStatus.PENDING  # the other group's row is its own
    assert get_inbox(rel, "m2").status is StubStatus.CONFIRMED
    assert get_inbox(rel, "m3").status is StubStatus.VOIDED
    assert _stub_status(rel, "m1") is StubStatus.DEAD  # some group gave up (DESIGN.md §1)
    assert _stub_status(rel, "m4") is StubStatus.DEAD


def test_an_empty_batch_or_one_of_settled_rows_changes_nothing(rel: Reliability) -> None:
    add_stub(rel, "m2", status=StubStatus.CONFIRMED)
    with rel.engine.begin() as conn:
        assert outbox.mark_dead_rows(conn, [], T0) == set()
        assert outbox.mark_dead_rows(conn, [("m2", "billing", "DEAD: x")], T0) == set()
    assert get_inbox(rel, "m2").status is StubStatus.CONFIRMED
