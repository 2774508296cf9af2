"""The stalled-group alarm: a group that consumed a queue and then stopped reaches a person, once per stall.

The watermark is written the way the guard leaves it (``set_progress``: max offset and when it last moved);
the broker's view is a probe answering per queue; time is the sweeper's clock. No sleeps.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from aiosmtpd.controller import Controller
from sqlalchemy import select

from reliable import Reliability
from reliable.models import StubNotification
from reliable.sweeper import EmailChannel, NoticeKind, SmtpConfig, Sweeper, WebhookChannel, metrics
from reliable.sweeper.notices import STALLED_TAG, body, stall_key
from reliable.types import StubStatus
from tests.services import free_port
from tests.sweeper.helpers import T0, Clock, MemoryChannel, QueueSender, add_stub, set_inbox, set_progress
from tests.sweeper.test_notify import Inbox, Webhook

STALL_S = 600
LATER = T0 + dt.timedelta(days=1)  # the rows' own resend is not due during these tests


class Probe:
    """The broker's max offset per (topic, queue): one past its last message."""

    def __init__(self, tops: dict[tuple[str, int], int]) -> None:
        self.tops = tops

    def max_offset(self, topic: str, queue_id: int) -> int | None:
        return self.tops.get((topic, queue_id))


def _stage(rel: Reliability, first: int, count: int, *, groups: tuple[str, ...] = ("billing",)) -> None:
    """``count`` messages on orders/0 at offsets ``first`` …, sent at T0, PENDING for ``groups``."""
    for offset in range(first, first + count):
        add_stub(
            rel,
            f"m{offset}",
            groups=list(groups),
            queue_id=0,
            queue_offset=offset,
            created_at=T0,
            last_sent_at=T0,
            resend_at=LATER,
        )


def _sweeper(rel: Reliability, clock: Clock, channel: MemoryChannel, probe: Probe | None) -> Sweeper:
    return Sweeper(
        rel,
        QueueSender(),
        probe=probe,
        channels=[channel],
        clock=clock,
        stall_after_s=STALL_S,
        purge_duty_cycle=1,
    )


def _stalls(channel: MemoryChannel) -> list[tuple[str, str, int | None, int | None]]:
    return [
        (n.consumer_group, n.topic, n.queue_id, n.queue_offset)
        for n in channel.notices
        if n.kind is NoticeKind.STALLED
    ]


def _gauge(group: str, queue_id: int = 0) -> float:
    return float(metrics.STALLED_SECONDS.labels(group, "orders", str(queue_id))._value.get())


def test_a_group_that_stops_is_told_once_per_stall_and_clears_when_it_resumes(
    rel: Reliability, clock: Clock
) -> None:
    channel = MemoryChannel()
    probe = Probe({("orders", 0): 1013})
    sweeper = _sweeper(rel, clock, channel, probe)
    set_progress(rel, 1009, updated_at=T0)  # consumed up to 1009 at T0, then its consumers went away
    _stage(rel, 1010, 3)

    clock.advance(STALL_S - 1)
    assert sweeper.run_once().stalled == 0 and channel.notices == []  # not still long enough yet

    clock.advance(2)
    first = sweeper.run_once()
    assert (first.stalled, first.stall_alarms) == (1, 1)
    assert _stalls(channel) == [("billing", "orders", 0, 1009)]
    (notice,) = channel.notices
    assert notice.reason.startswith(f"{STALLED_TAG} topic=orders queue=0 watermark=1009:")
    assert "m1010" in notice.reason and "3 message(s) beyond it" in notice.reason
    assert _gauge("billing") == STALL_S + 1

    for _ in range(3):  # it goes on being stalled: no second notice
        clock.advance(STALL_S)
        again = sweeper.run_once()
        assert (again.stalled, again.stall_alarms) == (1, 0)
    assert len(_stalls(channel)) == 1

    # the group is back: it consumed two of them, the watermark moved
    set_progress(rel, 1011, updated_at=clock.now)
    for mid in ("m1010", "m1011"):
        set_inbox(rel, mid, status=StubStatus.CONFIRMED)
    clock.advance(1)
    resumed = sweeper.run_once()
    assert (resumed.stalled, resumed.stall_alarms) == (0, 0)
    assert _gauge("billing") == 0
    with rel.engine.connect() as conn:
        left = conn.execute(
            select(StubNotification.__table__).where(StubNotification.message_id == stall_key_of())
        ).all()
    assert left == []

    # and stops again: a new stall, a second notice, at the new watermark
    clock.advance(STALL_S + 1)
    second = sweeper.run_once()
    assert (second.stalled, second.stall_alarms) == (1, 1)
    assert _stalls(channel) == [("billing", "orders", 0, 1009), ("billing", "orders", 0, 1011)]


def stall_key_of() -> str:
    from reliable.sweeper.notices import QueueRef

    return stall_key(QueueRef("orders", 0))


def test_a_quiet_queue_is_not_a_stall(rel: Reliability, clock: Clock) -> None:
    channel = MemoryChannel()
    probe = Probe({("orders", 0): 1013})  # one past 1012: the group has read everything there is
    sweeper = _sweeper(rel, clock, channel, probe)
    set_progress(rel, 1012, updated_at=T0)
    _stage(rel, 1010, 3)
    for mid in ("m1010", "m1011", "m1012"):
        set_inbox(rel, mid, status=StubStatus.CONFIRMED)
    clock.advance(10 * STALL_S)
    assert sweeper.run_once().stalled == 0

    # a message arrives on the quiet queue: the group is not stalled before it had stall_after to take it
    add_stub(
        rel,
        "m1013",
        queue_id=0,
        queue_offset=1013,
        created_at=clock.now,
        last_sent_at=clock.now,
        resend_at=LATER,
    )
    probe.tops[("orders", 0)] = 1014
    clock.advance(STALL_S - 1)
    assert sweeper.run_once().stalled == 0
    assert _stalls(channel) == []
    clock.advance(2)  # … and is, once it had
    assert sweeper.run_once().stall_alarms == 1


def test_only_the_group_that_stopped_is_told(rel: Reliability, clock: Clock) -> None:
    channel = MemoryChannel()
    sweeper = _sweeper(rel, clock, channel, Probe({("orders", 0): 1013}))
    set_progress(rel, 1009, group="billing", updated_at=T0)
    _stage(rel, 1010, 3, groups=("billing", "audit"))
    for mid in ("m1010", "m1011"):
        set_inbox(rel, mid, group="audit", status=StubStatus.CONFIRMED)
    for _ in range(3):
        clock.advance(STALL_S)
        # audit keeps consuming (slowly: it still owes m1012, which the broker has, since T0)
        set_progress(rel, 1011, group="audit", updated_at=clock.now)
        sweeper.run_once()
    assert _stalls(channel) == [("billing", "orders", 0, 1009)]
    assert _gauge("audit") == 0


def test_a_message_the_broker_lost_is_not_a_stall(rel: Reliability, clock: Clock) -> None:
    channel = MemoryChannel()
    # the group read all the broker has (max offset 1013 = one past 1012); m1013 never reached the broker,
    # so it is the resend rules' case (lost), not a stopped group
    sweeper = _sweeper(rel, clock, channel, Probe({("orders", 0): 1013}))
    set_progress(rel, 1012, updated_at=T0)
    _stage(rel, 1013, 1)
    clock.advance(10 * STALL_S)
    assert sweeper.run_once().stalled == 0 and channel.notices == []


def test_without_a_probe_the_age_of_the_oldest_owed_row_decides(rel: Reliability, clock: Clock) -> None:
    channel = MemoryChannel()
    sweeper = _sweeper(rel, clock, channel, None)  # RabbitMQ: no broker view of its queues
    set_progress(rel, 1009, updated_at=T0)
    _stage(rel, 1010, 2)
    clock.advance(STALL_S - 1)
    assert sweeper.run_once().stalled == 0
    clock.advance(2)
    assert sweeper.run_once().stall_alarms == 1
    (notice,) = channel.notices
    assert notice.kind is NoticeKind.STALLED and "no broker probe" in notice.reason


@pytest.fixture
def hook() -> Iterator[Webhook]:
    w = Webhook(fail_first=0)
    yield w
    w.close()


def test_stall_and_never_consumed_notices_have_their_own_text_not_the_dead_one(
    rel: Reliability, clock: Clock, hook: Webhook
) -> None:
    port = free_port()
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        email = EmailChannel(
            SmtpConfig(host="127.0.0.1", port=port, sender="s@example.org", recipients=("o@example.org",))
        )
        probe = Probe({("orders", 0): 1013, ("orders", 1): 2001})
        sweeper = Sweeper(
            rel,
            QueueSender(),
            probe=probe,
            channels=[email, WebhookChannel(hook.url, 5)],
            clock=clock,
            stall_after_s=STALL_S,
        )
        set_progress(rel, 1009, updated_at=T0)
        _stage(rel, 1010, 3)
        # a message on queue 1, which billing never consumed, sent an hour ago and due
        add_stub(rel, "q1", queue_id=1, queue_offset=2000, created_at=T0 - dt.timedelta(hours=1))
        clock.advance(STALL_S + 1)
        summary = sweeper.run_once()
    finally:
        controller.stop()
    assert (summary.never_consumed, summary.stall_alarms, summary.notify_failures) == (1, 1, 0)
    events = sorted(post["event"] for _, post in hook.posts)
    assert events == ["reliable.group.stalled", "reliable.queue.never_consumed"]
    subjects = sorted(str(m["msg"]["Subject"]) for m in inbox.messages)
    assert subjects == [
        "[reliable] 1 queue(s) never consumed by group(s) billing",
        "[reliable] group(s) billing stopped consuming 1 queue(s)",
    ]
    texts = [m["msg"].get_payload(decode=True).decode() for m in inbox.messages]
    assert not any("DEAD" in t or "revive" in t for t in texts)
    assert any("stopped being consumed" in t and "watermark=1009" in t for t in texts)
    assert any("never consumed there" in t and "q1" in t for t in texts)


def test_dead_text_is_unchanged_for_dead_notices() -> None:
    from reliable.sweeper import DeadNotice

    n = DeadNotice("m1", "orders", "billing", 3, 0, 7, "never received", "2026-11-21T12:00:00+00:00")
    assert body(NoticeKind.DEAD, [n]).startswith("1 message stub(s) went DEAD")
