"""Give-ups recorded by a sweeper of before 2026-11-28, which wrote a notice row per configured channel and
no ``log`` row, still reach every channel a sweeper of today has — without paging anyone a second time.

Such rows are what a database upgraded from revision 0007 or older holds: a DEAD row whose e-mail notice is
owed (or delivered) and nothing on the ``log`` channel. Today's sweepers owe a notice on their channels only
through its ``log`` row, so a webhook configured after the upgrade was never told about these DEAD rows,
although the docs promise that a channel added later is owed every notice still told.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import insert, select

from reliable import Reliability
from reliable import constants as C
from reliable.models import StubNotification
from reliable.sweeper import Sweeper
from reliable.sweeper.selection import notif
from reliable.types import StubStatus
from tests.sweeper.helpers import T0, Clock, MemoryChannel, QueueSender, add_stub, set_inbox

REASON = "never received after 3 send(s): last copy at 2026-11-20T12:00:05+00:00 queue 0 offset 7"
DIED = T0 - dt.timedelta(days=3)


def _old_notice(rel: Reliability, message_id: str, channel: str, *, delivered: bool) -> None:
    """The row a give-up of before 2026-11-28 wrote for one configured channel (and no ``log`` row)."""
    row: dict[str, Any] = {
        "message_id": message_id,
        "consumer_group": "billing",
        "channel": channel,
        "reason": REASON,
        "created_at": DIED,
        "notified_at": DIED if delivered else None,
        "attempts": 1 if delivered else 2,
        "last_error": None if delivered else "smtp: connection refused",
    }
    with rel.engine.begin() as conn:
        conn.execute(insert(notif), [row])


def _given_up_long_ago(rel: Reliability, message_id: str) -> None:
    add_stub(rel, message_id, send_count=3)
    set_inbox(rel, message_id, status=StubStatus.DEAD, last_error="DEAD: " + REASON, updated_at=DIED)


def test_a_give_up_told_on_some_channels_only_is_owed_on_a_channel_added_after_the_upgrade(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    _given_up_long_ago(rel, "told-by-mail")  # e-mailed then
    _old_notice(rel, "told-by-mail", "email", delivered=True)
    _given_up_long_ago(rel, "mail-owed")  # the mail server was down
    _old_notice(rel, "mail-owed", "email", delivered=False)

    email, pager = MemoryChannel("email"), MemoryChannel("pager")
    sweeper = Sweeper(rel, sender, clock=clock, channels=[email, pager])
    first = sweeper.run_once()

    # the new channel hears of both DEAD rows; e-mail delivers what it owed, and does not repeat itself
    assert sorted(n.message_id for n in pager.notices) == ["mail-owed", "told-by-mail"]
    assert [n.message_id for n in email.notices] == ["mail-owed"]
    assert {n.reason for n in pager.notices} == {REASON}
    # not new deaths: nothing pages as if the guard had just dead-lettered them
    assert (first.dead, first.dead_lettered) == (0, 0)

    clock.advance(60)
    again = sweeper.run_once()
    assert again.notified == 0
    assert len(pager.notices) == 2 and len(email.notices) == 1
    with rel.engine.connect() as conn:
        left = conn.execute(
            select(StubNotification.message_id, StubNotification.channel).where(
                StubNotification.notified_at.is_(None)
            )
        ).all()
    assert left == []


def test_a_give_up_told_then_is_not_told_to_its_channel_again(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    """The adoption of an old notice keeps its delivered rows: the person e-mailed then is not e-mailed
    again, and a revive still clears every row of it."""
    _given_up_long_ago(rel, "told-by-mail")
    _old_notice(rel, "told-by-mail", "email", delivered=True)
    email = MemoryChannel("email")
    Sweeper(rel, sender, clock=clock, channels=[email]).run_once()
    assert email.notices == []
    with rel.engine.connect() as conn:
        channels = sorted(
            conn.execute(
                select(StubNotification.channel, StubNotification.created_at).where(
                    StubNotification.message_id == "told-by-mail"
                )
            ).all()
        )
    assert [c for c, _ in channels] == ["email", C.NOTIFY_CHANNEL_LOG]
    assert all(when == DIED for _, when in channels)  # told back then, not now
