"""The stalled-group alarm without a broker probe, where the sender puts a targeted resend on the group's
retry topic (``%RETRY%{group}``: broker_sim and RocketMQ 4.x — a sender with no probe, or a broker group
that does not answer it).

The inbox row records the queue id and broker group of the group's newest copy, not its topic. Such a
copy is on a queue of the retry topic, so its queue id says nothing about the topic's queue of the same
number: counting it there called a fine, quiet queue stalled, and cleared (or held open) the stall of the
queue the group really stopped on. The sweeper re-sends here itself (``too_old``: with no probe a copy older
than ``max_unconfirmed_age`` is re-sent, even one queued behind a stopped group). No sleeps: the sweeper's
clock.
"""

from __future__ import annotations

from reliable import Reliability
from reliable.sweeper import Sweeper
from reliable.types import StubStatus
from tests.sweeper.helpers import (
    T0,
    Clock,
    MemoryChannel,
    QueueSender,
    add_stub,
    get_inbox,
    set_inbox,
    set_progress,
)
from tests.sweeper.test_stall import STALL_S, _stalls

RETRY = "%RETRY%"
#: the rows are re-sent (``too_old``) once this old: after the stall was raised
MAX_AGE_S = 2 * STALL_S


def _sweeper(rel: Reliability, clock: Clock, channel: MemoryChannel, sender: QueueSender) -> Sweeper:
    return Sweeper(
        rel,
        sender,  # no probe: QueueSender is none
        channels=[channel],
        clock=clock,
        stall_after_s=STALL_S,
        max_unconfirmed_age_s=MAX_AGE_S,
        purge_duty_cycle=1,
    )


def _stage(rel: Reliability, queue_id: int, first: int, count: int) -> list[str]:
    """``count`` messages on orders/``queue_id`` at offsets ``first`` …, sent at T0, PENDING for billing
    (audit, the topic's other group, took them all); due at once (held ``queued`` until they are old)."""
    ids = [f"q{queue_id}-{offset}" for offset in range(first, first + count)]
    for offset, mid in zip(range(first, first + count), ids, strict=True):
        add_stub(
            rel,
            mid,
            groups=["billing", "audit"],
            queue_id=queue_id,
            queue_offset=offset,
            created_at=T0,
            last_sent_at=T0,
            resend_at=T0,
        )
        set_inbox(rel, mid, group="audit", status=StubStatus.CONFIRMED)
    return ids


def test_a_group_stopped_on_a_queue_stays_stalled_there_when_its_backlog_goes_to_its_retry_topic(
    rel: Reliability, clock: Clock
) -> None:
    """billing stopped on orders/1 (its consumer of that queue hangs) and read all of orders/0, which is
    quiet since. The backlog of orders/1 is re-sent to %RETRY%billing queue 0 and not taken either: the
    stall of orders/1 stays one open episode — until 2026-11-29 it was "cleared" while billing still read
    nothing, and orders/0, a fine queue sharing the retry queue's number, was called stalled instead."""
    channel = MemoryChannel()
    sender = QueueSender(queues=1, retry_prefix=RETRY)  # every resend lands on %RETRY%billing queue 0
    sweeper = _sweeper(rel, clock, channel, sender)
    set_progress(rel, 2000, queue_id=0, updated_at=T0)  # all of orders/0 read: quiet since T0
    set_progress(rel, 1009, queue_id=1, updated_at=T0)  # stopped on orders/1 at T0
    owed = _stage(rel, 1, 1010, 3)

    clock.advance(STALL_S + 1)
    raised = sweeper.run_once()
    assert (raised.stalled, raised.stall_alarms, raised.resent) == (1, 1, 0)
    assert _stalls(channel) == [("billing", "orders", 1, 1009)]

    clock.advance(MAX_AGE_S - STALL_S)  # the backlog is too old: re-sent to the group's retry topic
    resent = sweeper.run_once()
    assert resent.resent == 3 and [m.target_group for m in sender.sent] == ["billing"] * 3
    assert {(get_inbox(rel, mid).queue_id, get_inbox(rel, mid).resend_count) for mid in owed} == {(0, 1)}
    assert (resent.stalled, resent.stall_alarms) == (1, 0)

    for _ in range(3):  # billing takes nothing, on either topic: one stall, on orders/1, and only that one
        clock.advance(STALL_S)
        still = sweeper.run_once()
        assert (still.stalled, still.stall_alarms) == (1, 0)
    assert _stalls(channel) == [("billing", "orders", 1, 1009)]

    for mid in owed:  # billing's consumers are back: they take the resends on the retry topic
        set_inbox(rel, mid, status=StubStatus.CONFIRMED)
    clock.advance(1)
    assert sweeper.run_once().stalled == 0


def test_a_copy_on_the_retry_topic_does_not_hold_open_the_stall_of_the_queue_with_its_number(
    rel: Reliability, clock: Clock
) -> None:
    """billing stopped on orders/0; what it owed there went to its retry topic and was taken there, so it
    owes nothing on orders/0 any more: the episode ends. A copy from orders/1 that the broker lost (billing
    read past it there) waits on %RETRY%billing queue 0 — it is no evidence about orders/0, where it
    kept the stall open (and on orders/1, which billing goes on reading, there is no still watermark)."""
    channel = MemoryChannel()
    sender = QueueSender(queues=1, retry_prefix=RETRY)
    sweeper = _sweeper(rel, clock, channel, sender)
    set_progress(rel, 1009, queue_id=0, updated_at=T0)  # stopped on orders/0 at T0
    stopped_on = _stage(rel, 0, 1010, 2)
    lost = _stage(rel, 1, 500, 1)  # its copy on orders/1 never reached billing
    set_progress(rel, 510, queue_id=1, updated_at=T0)  # billing read orders/1 past it: overtaken

    clock.advance(STALL_S + 1)
    set_progress(rel, 520, queue_id=1, updated_at=clock.now)  # billing goes on reading orders/1
    raised = sweeper.run_once()
    assert (raised.stall_alarms, raised.resent) == (1, 1)  # the lost one re-sent at once (overtaken)
    assert _stalls(channel) == [("billing", "orders", 0, 1009)]
    assert get_inbox(rel, lost[0]).queue_id == 0  # on %RETRY%billing queue 0

    clock.advance(MAX_AGE_S - STALL_S)
    set_progress(rel, 530, queue_id=1, updated_at=clock.now)
    assert sweeper.run_once().resent == 2  # orders/0's backlog, too old: re-sent to the retry topic
    for mid in stopped_on:  # … and taken there
        set_inbox(rel, mid, status=StubStatus.CONFIRMED)

    clock.advance(1)
    set_progress(rel, 540, queue_id=1, updated_at=clock.now)
    cleared = sweeper.run_once()
    assert (cleared.stalled, cleared.stall_alarms) == (0, 0)  # billing owes nothing on orders/0 any more
    assert _stalls(channel) == [("billing", "orders", 0, 1009)]
