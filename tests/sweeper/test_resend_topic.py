"""The inbox row records the topic a targeted resend landed on (``resend_topic``, migration 0011), and the
sweeper reads it back rather than asking its current sender.

What a user needs: where a resend lands depends on the sender (``%RETRY%{group}`` on broker_sim and RocketMQ
4.x, the message's own topic on RabbitMQ, Kafka and RocketMQ 5.x). A sweeper restarted with another sender
configuration (a migration from RocketMQ 4.x to 5.x, say) asked the new sender about rows the old one had
re-sent and matched their ``%RETRY%`` queue ids with the topic's queues: the stalled-group alarm of the queue
the group stopped on cleared while it still read nothing, and a fine queue with the same number was called
stalled. No sleeps: the sweeper's clock.
"""

from __future__ import annotations

import pytest

from reliable import Reliability
from tests.sweeper.helpers import T0, Clock, MemoryChannel, QueueSender, get_inbox, set_progress
from tests.sweeper.test_stall import STALL_S, _stalls
from tests.sweeper.test_stall_retry_topic import MAX_AGE_S, RETRY, _stage, _sweeper


@pytest.mark.parametrize("retry_prefix", [RETRY, None], ids=["retry-topic", "own-topic"])
def test_a_resend_records_the_topic_it_landed_on(
    rel: Reliability, clock: Clock, retry_prefix: str | None
) -> None:
    sender = QueueSender(queues=1, retry_prefix=retry_prefix)
    sweeper = _sweeper(rel, clock, MemoryChannel(), sender)
    set_progress(rel, 2000, queue_id=0, updated_at=T0)  # billing read past them: overtaken, re-sent at once
    owed = _stage(rel, 0, 1010, 2)
    assert {get_inbox(rel, mid).resend_topic for mid in owed} == {None}  # the producer's copy only

    clock.advance(1)
    assert sweeper.run_once().resent == 2
    want = "%RETRY%billing" if retry_prefix else "orders"
    assert {(get_inbox(rel, m).resend_topic, get_inbox(rel, m).resend_count) for m in owed} == {(want, 1)}

    sender.fail_next = 2  # a failed resend keeps the last landed copy's position and topic
    clock.advance(MAX_AGE_S)
    assert sweeper.run_once().resent == 0
    assert {(get_inbox(rel, m).resend_topic, get_inbox(rel, m).resend_count) for m in owed} == {(want, 2)}


def test_a_sweeper_restarted_with_another_sender_keeps_the_stall_on_the_queue_the_group_stopped_on(
    rel: Reliability, clock: Clock
) -> None:
    """billing stopped on orders/1 and read all of orders/0 (quiet since). The first sweeper re-sent the
    backlog to %RETRY%billing queue 0; the next one runs with a sender that puts resends on the topic. The
    rows say where their copies are: the stall stays on orders/1, orders/0 is not called stalled, and the
    copies are not taken for overtaken there."""
    channel = MemoryChannel()
    old = _sweeper(rel, clock, channel, QueueSender(queues=1, retry_prefix=RETRY))
    set_progress(rel, 2000, queue_id=0, updated_at=T0)
    set_progress(rel, 1009, queue_id=1, updated_at=T0)
    owed = _stage(rel, 1, 1010, 3)
    clock.advance(MAX_AGE_S + 1)
    first = old.run_once()
    assert (first.resent, first.stall_alarms) == (3, 1)
    assert {(get_inbox(rel, m).queue_id, get_inbox(rel, m).resend_topic) for m in owed} == {
        (0, "%RETRY%billing")
    }

    # resends on the topic from now on; the rows' copies wait on %RETRY%billing (not taken, not re-sent yet)
    new = _sweeper(rel, clock, channel, QueueSender(queues=1))
    clock.advance(STALL_S)
    still = new.run_once()
    # not "overtaken" by billing's position on orders/0, where the new sender would have put them
    assert (still.resent, still.held) == (0, 3)
    assert (still.stalled, still.stall_alarms) == (1, 0)
    assert _stalls(channel) == [("billing", "orders", 1, 1009)]
