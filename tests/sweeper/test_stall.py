"""The stalled-group alarm: a group that consumed a queue and then stopped reaches a person, once per stall.

The watermark is written the way the guard leaves it (``set_progress``: max offset and when it last moved);
the broker's view is a probe answering per queue; time is the sweeper's clock. No sleeps.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterator

import pytest
from aiosmtpd.controller import Controller
from sqlalchemy import select

from broker_sim.common.net import listen_port
from reliable import Reliability
from reliable import constants as C
from reliable.models import StubNotification
from reliable.sweeper import EmailChannel, NoticeKind, SmtpConfig, Sweeper, WebhookChannel, metrics
from reliable.sweeper.giveup import never_consumed_key
from reliable.sweeper.notices import (
    NEVER_CONSUMED_TAG,
    STALLED_TAG,
    QueueRef,
    body,
    parse_tag,
    queue_tag,
    stall_key,
)
from reliable.types import StubStatus
from tests.sweeper.helpers import T0, Clock, MemoryChannel, QueueSender, add_stub, set_inbox, set_progress
from tests.sweeper.test_notify import Inbox, Webhook

STALL_S = 600
LATER = T0 + dt.timedelta(days=1)  # the rows' own resend is not due during these tests


class Probe:
    """The broker's max offset per (topic, queue): one past its last message; on a cluster per (topic,
    broker group, queue)."""

    def __init__(
        self, tops: dict[tuple[str, int], int], groups: dict[tuple[str, str, int], int] | None = None
    ) -> None:
        self.tops = tops
        self.groups = groups or {}

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        if broker_name:
            return self.groups.get((topic, broker_name, queue_id))
        return self.tops.get((topic, queue_id))


class RetentionProbe(Probe):
    """A probe that also tells each queue's min offset (the broker's retention deleted below it)."""

    def __init__(self, tops: dict[tuple[str, int], int], bottoms: dict[tuple[str, int], int]) -> None:
        super().__init__(tops)
        self.bottoms = bottoms

    def min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return self.bottoms.get((topic, queue_id))


def _stage(
    rel: Reliability, first: int, count: int, *, groups: tuple[str, ...] = ("billing",), broker: str = ""
) -> None:
    """``count`` messages on orders/0 (of ``broker``) at offsets ``first`` …, sent at T0, PENDING for
    ``groups``."""
    for offset in range(first, first + count):
        add_stub(
            rel,
            f"m{broker}{offset}",
            groups=list(groups),
            broker_name=broker,
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


def _gauge(group: str, queue_id: int = 0, broker: str = "") -> float:
    return float(metrics.STALLED_SECONDS.labels(group, "orders", broker, str(queue_id))._value.get())


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


def test_a_queue_whose_retention_deleted_what_the_group_owed_is_no_stall(
    rel: Reliability, clock: Clock
) -> None:
    """The group stopped at 1009; the broker's retention then deleted 1010–1012. It has nothing to read
    there — a stall alarm saying "the broker holds 3 messages beyond it" would send a person to look at
    healthy consumers (the resend rules send the deleted ones again: verdict EXPIRED)."""
    channel = MemoryChannel()
    sweeper = _sweeper(rel, clock, channel, RetentionProbe({("orders", 0): 1013}, {("orders", 0): 1013}))
    set_progress(rel, 1009, updated_at=T0)
    _stage(rel, 1010, 3)
    clock.advance(STALL_S + 1)
    assert sweeper.run_once().stalled == 0 and _stalls(channel) == []


def test_a_stall_counts_only_what_the_broker_still_holds_beyond_the_watermark(
    rel: Reliability, clock: Clock
) -> None:
    channel = MemoryChannel()
    sweeper = _sweeper(rel, clock, channel, RetentionProbe({("orders", 0): 1013}, {("orders", 0): 1011}))
    set_progress(rel, 1009, updated_at=T0)
    _stage(rel, 1010, 3)  # 1010 deleted by the broker's retention, 1011 and 1012 still there
    clock.advance(STALL_S + 1)
    assert sweeper.run_once().stall_alarms == 1
    (notice,) = channel.notices
    assert "2 message(s) beyond it" in notice.reason and "first it owes is m1011" in notice.reason


def test_a_group_still_stopped_after_its_expired_copies_were_resent_stays_stalled(
    rel: Reliability, clock: Clock
) -> None:
    """The group stopped at 1009 and stayed stopped; the broker's retention deleted 1010–1012 and the sweeper
    re-sent them to the group (EXPIRED, onto its retry topic). It does not read those either: its stall must
    stay open — a person is told, and nobody reads "cleared" while its consumers are still down. A group
    that came back takes the resends and owes nothing: then the episode ends."""
    channel = MemoryChannel()
    sweeper = _sweeper(rel, clock, channel, RetentionProbe({("orders", 0): 1020}, {("orders", 0): 1013}))
    set_progress(rel, 1009, updated_at=T0)
    _stage(rel, 1010, 3)
    for offset in range(1010, 1013):  # the sweeper's EXPIRED resends, onto the group's retry topic at T0
        set_inbox(rel, f"m{offset}", queue_id=0, queue_offset=offset - 1010, resend_count=1, updated_at=T0)
    clock.advance(STALL_S - 1)
    assert sweeper.run_once().stall_alarms == 0  # the resends are younger than stall_after: maybe it reads
    clock.advance(2)
    raised = sweeper.run_once()
    assert (raised.stalled, raised.stall_alarms) == (1, 1)
    (notice,) = channel.notices
    assert "m1010" in notice.reason and "7 message(s) beyond it" in notice.reason  # 1013..1019 still held
    clock.advance(STALL_S)
    assert sweeper.run_once().stalled == 1  # still stopped: still stalled
    for offset in range(1010, 1013):  # it came back and took its resends (the topic's queue stays quiet)
        set_inbox(rel, f"m{offset}", status=StubStatus.CONFIRMED)
    clock.advance(1)
    assert sweeper.run_once().stalled == 0


class DownProbe(RetentionProbe):
    """A retention probe whose broker group can go down: it then answers "cannot tell" (``None``)."""

    down = False

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return None if self.down else super().max_offset(topic, queue_id, broker_name)

    def min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return None if self.down else super().min_offset(topic, queue_id, broker_name)


def test_a_stall_stays_one_episode_through_a_round_the_broker_cannot_answer(
    rel: Reliability, clock: Clock
) -> None:
    """A broker outage says nothing about whether a group consumes: clearing the stall then re-raised it once
    the broker answered again — a second notice for one unchanged stall (found on a cluster whose broker
    group restarted)."""
    channel = MemoryChannel()
    probe = DownProbe({("orders", 0): 1013}, {("orders", 0): 1013})  # retention deleted 1010–1012
    sweeper = _sweeper(rel, clock, channel, probe)
    set_progress(rel, 1009, updated_at=T0)
    _stage(rel, 1010, 3)
    for offset in range(1010, 1013):  # re-sent to the group's retry topic (EXPIRED), not taken either
        set_inbox(rel, f"m{offset}", queue_id=3, queue_offset=offset - 1010, resend_count=1, updated_at=T0)
    clock.advance(STALL_S + 1)
    assert sweeper.run_once().stall_alarms == 1
    (notice,) = channel.notices
    assert "retention deleted what it owed there" in notice.reason and "0 message(s)" not in notice.reason
    probe.down = True
    clock.advance(STALL_S)
    assert sweeper.run_once().stalled == 1
    probe.down = False
    clock.advance(STALL_S)
    again = sweeper.run_once()
    assert (again.stalled, again.stall_alarms) == (1, 0) and len(channel.notices) == 1


def stall_key_of() -> str:
    return stall_key(QueueRef("orders", 0))


@pytest.mark.parametrize("probed", [True, False], ids=["probe", "no-probe"])
def test_a_stall_on_one_broker_group_names_it_and_not_the_other(
    rel: Reliability, clock: Clock, probed: bool
) -> None:
    """Queue 0 of broker-a and queue 0 of broker-b are different queues: billing stopped on broker-b's
    while it goes on consuming broker-a's — one notice, naming broker-b. audit, still on broker-b's queue 0
    too, owes nothing there (it owes messages on broker-a's queue 0, beyond its broker-b position): not
    stalled."""
    channel = MemoryChannel()
    probe = Probe({}, {("orders", "broker-a", 0): 1016, ("orders", "broker-b", 0): 513}) if probed else None
    sweeper = _sweeper(rel, clock, channel, probe)
    _stage(rel, 1013, 3, groups=("billing", "audit"), broker="broker-a")
    _stage(rel, 510, 3, groups=("billing",), broker="broker-b")
    for group in ("billing", "audit"):
        set_progress(rel, 509, group=group, broker_name="broker-b", updated_at=T0)
    for _ in range(3):
        clock.advance(STALL_S)
        for group in ("billing", "audit"):  # both keep consuming broker-a's queue 0 (slowly)
            set_progress(rel, 1012, group=group, broker_name="broker-a", updated_at=clock.now)
        sweeper.run_once()
    assert _stalls(channel) == [("billing", "orders", 0, 509)]
    (notice,) = channel.notices
    assert notice.reason.startswith(f"{STALLED_TAG} topic=orders broker=broker-b queue=0 watermark=509:")
    assert "queue 0 of broker-b" in notice.reason and "mbroker-b510" in notice.reason
    if probed:
        assert "3 message(s) beyond it (max offset 513)" in notice.reason
    tag = parse_tag(notice.reason)
    assert tag is not None and tag.queue == QueueRef("orders", 0, "broker-b")
    assert _gauge("billing", broker="broker-b") == 3 * STALL_S
    assert _gauge("billing", broker="broker-a") == 0 and _gauge("audit", broker="broker-b") == 0


def test_one_tag_vocabulary_and_the_form_of_before_the_broker_group_is_still_read() -> None:
    cluster = QueueRef("orders", 3, "broker-b")
    assert (
        never_consumed_key("orders", 3, "broker-b") == "NEVER_CONSUMED topic=orders broker=broker-b queue=3:"
    )
    assert never_consumed_key("orders", 3, "broker-b") == queue_tag(NEVER_CONSUMED_TAG, cluster)
    stalled = queue_tag(STALLED_TAG, cluster, 41) + " group billing …"
    parsed = parse_tag(stalled)
    assert parsed is not None and (parsed.kind, parsed.queue, parsed.watermark) == (
        NoticeKind.STALLED,
        cluster,
        41,
    )
    # alarms raised before the broker group joined the queue's identity: no broker part, same key as then
    old = parse_tag("STALLED topic=orders queue=3 watermark=41: group billing has consumed nothing")
    assert old is not None and old.queue == QueueRef("orders", 3, "")
    assert queue_tag(STALLED_TAG, old.queue, 41) == "STALLED topic=orders queue=3 watermark=41:"
    assert never_consumed_key("orders", 3) == "NEVER_CONSUMED topic=orders queue=3:"
    before = (C.STALL_KEY_PREFIX + hashlib.sha256(b"orders\n3").hexdigest())[: C.MESSAGE_ID_MAX]
    assert stall_key(QueueRef("orders", 3)) == before
    assert stall_key(cluster) not in {stall_key(QueueRef("orders", 3)), stall_key(QueueRef("orders", 3, "a"))}


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
    # the age rules go on re-sending without a probe: the notice must not promise otherwise
    assert "re-sent meanwhile" in notice.reason and "No resend is made" not in notice.reason


def test_without_a_probe_the_notice_names_the_first_message_the_group_owes(
    rel: Reliability, clock: Clock
) -> None:
    """The notice says where the group stopped and which message it owes first. Without a probe the lookup
    had no order and named whichever row the database met first — here the last staged, m1014, while the
    group stopped at 1009 owes m1010 first (seen in CI as a flaky ``m511`` for ``m510``)."""
    channel = MemoryChannel()
    sweeper = _sweeper(rel, clock, channel, None)
    set_progress(rel, 1009, updated_at=T0)
    for offset in range(1014, 1009, -1):  # staged last offset first: the table's physical order reversed
        _stage(rel, offset, 1)
    clock.advance(STALL_S + 1)
    assert sweeper.run_once().stall_alarms == 1
    (notice,) = channel.notices
    assert "owes m1010 " in notice.reason, notice.reason


@pytest.fixture
def hook() -> Iterator[Webhook]:
    w = Webhook(fail_first=0)
    yield w
    w.close()


def test_stall_and_never_consumed_notices_have_their_own_text_not_the_dead_one(
    rel: Reliability, clock: Clock, hook: Webhook
) -> None:
    port = listen_port()
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
