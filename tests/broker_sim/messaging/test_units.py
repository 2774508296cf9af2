"""Pure pieces: process-queue offsets, retry/delay arithmetic, the fault injector, the clock scheduler."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker_sim.client.process_queue import ProcessQueue
from broker_sim.clock import ManualClock
from broker_sim.common.constants import (
    SendBackTarget,
    parse_delay_levels,
    parse_tag_expression,
    send_back_decision,
)
from broker_sim.common.message import (
    MessageExt,
    Prop,
    decode_offset_msg_id,
    encode_offset_msg_id,
    new_uniq_key,
)
from broker_sim.common.scheduler import Scheduler
from broker_sim.faults import FaultInjector, FaultKind, SendAckLost


def msgs(*offsets: int) -> list[MessageExt]:
    return [MessageExt("T", b"x", queue_offset=o) for o in offsets]


# -- process queue ------------------------------------------------------------------------------------------


def test_committed_offset_is_smallest_unfinished_then_max_plus_one() -> None:
    pq = ProcessQueue()
    batch = msgs(*range(2100, 2110))
    pq.put_messages(batch)
    stalled = batch[1]  # 2101
    assert pq.remove_messages([m for m in batch if m is not stalled]) == 2101
    assert pq.committable_offset() == 2101
    assert pq.msg_count == 1
    assert pq.remove_messages([stalled]) == 2110  # window empty: max + 1
    assert pq.remove_messages([stalled]) == -1  # nothing in flight at all


def test_window_ends_at_the_last_pulled_offset() -> None:
    """RocketMQ's ``queueOffsetMax`` is the last pulled offset, not the largest ever: pulled at 20, 21 and
    then (the offset moved back) at 0..2, the window commits 3 once all is finished, not 22 — 22 would skip
    what the broker stores at 3..21 next. (The pull loop also gives a moved queue a new window.)"""
    pq = ProcessQueue()
    before = msgs(20, 21)
    pq.put_messages(before)
    assert pq.remove_messages(before) == 22
    after = msgs(0, 1, 2)
    pq.put_messages(after)
    assert pq.remove_messages(after) == 3
    assert pq.committable_offset() == 3


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=60, unique=True), st.randoms())
def test_commit_offset_never_passes_an_unfinished_message(offsets: list[int], rnd) -> None:  # type: ignore[no-untyped-def]
    pq = ProcessQueue()
    offsets = sorted(offsets)  # a pull returns a queue's messages in offset order
    batch = msgs(*offsets)
    pq.put_messages(batch)
    pending = set(offsets)
    order = list(batch)
    rnd.shuffle(order)
    for m in order:
        got = pq.remove_messages([m])
        pending.discard(m.queue_offset)
        assert got == (min(pending) if pending else max(offsets) + 1)


def test_flow_control_measures_and_duplicates_ignored() -> None:
    pq = ProcessQueue()
    pq.put_messages(msgs(5, 2500))
    pq.put_messages(msgs(5))
    assert pq.msg_count == 2
    assert pq.max_span() == 2495
    assert pq.msg_size_bytes == 2


def test_orderly_take_commit_and_consume_again() -> None:
    pq = ProcessQueue()
    assert pq.put_messages(msgs(1, 2, 3)) is True  # first put dispatches an orderly consume
    assert pq.put_messages(msgs(4)) is False  # already consuming
    taken = pq.take_messages(2)
    assert [m.queue_offset for m in taken] == [1, 2]
    assert pq.committable_offset() == 1
    pq.make_message_to_consume_again(taken)
    assert [m.queue_offset for m in pq.take_messages(3)] == [1, 2, 3]
    assert pq.commit() == 4
    assert [m.queue_offset for m in pq.take_messages(5)] == [4]
    assert pq.commit() == 5
    assert pq.take_messages(1) == [] and pq.consuming is False


def test_expired_messages_use_consume_start_time() -> None:
    pq = ProcessQueue()
    a, b = msgs(1, 2)
    a.properties[Prop.CONSUME_START_TIME] = "1000"
    b.properties[Prop.CONSUME_START_TIME] = "900000"
    pq.put_messages([a, b])
    assert pq.expired_messages(1000 + 15 * 60_000 + 1, 15 * 60_000) == [a]


# -- retry arithmetic ---------------------------------------------------------------------------------------


def test_delay_levels_and_retry_schedule() -> None:
    levels = parse_delay_levels()
    assert len(levels) == 18 and levels[0] == 1000 and levels[-1] == 7_200_000
    schedule = [levels[send_back_decision(n, 0).delay_level - 1] for n in range(16)]
    assert schedule[:4] == [10_000, 30_000, 60_000, 120_000]
    assert schedule[-1] == 7_200_000  # 16th retry: 2 h
    assert sum(schedule) == 17_140_000  # 4 h 45 m 40 s in total before the DLQ


@pytest.mark.parametrize(
    ("times", "level", "maximum", "target", "used"),
    [
        (0, 0, 16, SendBackTarget.RETRY, 3),
        (5, 0, 16, SendBackTarget.RETRY, 8),
        (15, 0, 16, SendBackTarget.RETRY, 18),
        (16, 0, 16, SendBackTarget.DLQ, 0),
        (2, 7, 16, SendBackTarget.RETRY, 7),
        (0, -1, 16, SendBackTarget.DLQ, 0),
        (3, 0, 3, SendBackTarget.DLQ, 0),
    ],
)
def test_send_back_decision(times: int, level: int, maximum: int, target: SendBackTarget, used: int) -> None:
    d = send_back_decision(times, level, maximum)
    assert (d.target, d.delay_level) == (target, used)


def test_bad_delay_level_spec_and_tag_expressions() -> None:
    with pytest.raises(ValueError):
        parse_delay_levels("1s 5x")
    assert parse_tag_expression("*") is None
    assert parse_tag_expression("A || B ||C") == frozenset({"A", "B", "C"})
    with pytest.raises(ValueError):
        parse_tag_expression("||")


def test_ids() -> None:
    ids = {new_uniq_key() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 32 for i in ids)
    mid = encode_offset_msg_id("10.1.2.3:10911", 123456789)
    assert len(mid) == 32 and decode_offset_msg_id(mid) == ("10.1.2.3:10911", 123456789)


# -- faults -------------------------------------------------------------------------------------------------


def test_fault_injector_lost_acks_commits_and_counts() -> None:
    f = FaultInjector(seed=7, clock=ManualClock())
    f.lose_send_acks(2)
    for i in range(2):
        with pytest.raises(SendAckLost):
            f.on_send_stored("T", 0, i)
    f.on_send_stored("T", 0, 2)  # third goes through
    f.lose_offset_commits(1, group="G")
    assert f.drop_offset_commit("other", "T", 0, 5) is False
    assert f.drop_offset_commit("G", "T", 0, 5) is True
    assert f.drop_offset_commit("G", "T", 0, 6) is False
    assert f.counts[FaultKind.LOST_SEND_ACK] == 2 and f.counts[FaultKind.LOST_OFFSET_COMMIT] == 1
    assert [e.kind for e in f.events] == [FaultKind.LOST_SEND_ACK] * 2 + [FaultKind.LOST_OFFSET_COMMIT]


def test_probabilistic_faults_repeat_with_the_seed() -> None:
    def run(seed: int) -> list[int]:
        f = FaultInjector(seed=seed)
        f.lose_send_acks(0, probability=0.3)
        lost = []
        for i in range(200):
            try:
                f.on_send_stored("T", 0, i)
            except SendAckLost:
                lost.append(i)
        return lost

    assert run(1) == run(1)
    assert run(1) != run(2)
    assert 30 < len(run(1)) < 90


def test_queue_delay_expires_on_the_clock() -> None:
    clock = ManualClock()
    f = FaultInjector(clock=clock)
    f.delay_queue("T", 1, 5000)
    assert f.queue_delayed_until("T", 1) == clock.now_ms() + 5000
    assert f.queue_delayed_until("T", 2) == 0
    clock.advance(5)
    assert f.queue_delayed_until("T", 1) == 0


# -- scheduler ----------------------------------------------------------------------------------------------


def test_scheduler_runs_jobs_only_when_the_manual_clock_reaches_them() -> None:
    clock = ManualClock()
    s = Scheduler(clock, "t")
    ran: list[str] = []
    fired = threading.Event()
    periodic = threading.Event()

    def job() -> None:
        ran.append("once")
        fired.set()

    def tick() -> None:
        ran.append("tick")
        periodic.set()

    s.schedule(10_000, job)
    s.schedule_periodic(5000, 5000, tick)
    assert not fired.wait(0.05)  # real time passes, clock time does not
    clock.advance(5)
    assert periodic.wait(2)
    periodic.clear()
    assert not fired.is_set()
    clock.advance(3601)  # an hour at once: the periodic job runs once, no catch-up storm
    assert fired.wait(2) and periodic.wait(2)
    s.shutdown()
    assert ran.count("tick") == 2 and ran.count("once") == 1


class ProcessQueueMachine(RuleBasedStateMachine):
    """Random pulls, completions and orderly take/commit/retry: the commit offset never skips a message
    that is pulled but not finished, and never goes backwards while messages keep arriving in order."""

    def __init__(self) -> None:
        super().__init__()
        self.pq = ProcessQueue()
        self.next_offset = 0
        self.unfinished: set[int] = set()
        self.taken: list[MessageExt] = []
        self.last_commit = -1

    @rule(n=st.integers(1, 8))
    def pull(self, n: int) -> None:
        batch = msgs(*range(self.next_offset, self.next_offset + n))
        self.pq.put_messages(batch)
        self.unfinished.update(range(self.next_offset, self.next_offset + n))
        self.next_offset += n

    @rule(data=st.data())
    def finish_some(self, data: st.DataObject) -> None:
        pending = sorted(self.unfinished - {m.queue_offset for m in self.taken})
        if not pending:
            return
        done = data.draw(st.lists(st.sampled_from(pending), unique=True, max_size=len(pending)))
        self.pq.remove_messages(msgs(*done))
        self.unfinished.difference_update(done)

    @rule(k=st.integers(1, 4))
    def take(self, k: int) -> None:
        if not self.taken:
            self.taken = self.pq.take_messages(k)

    @rule(success=st.booleans())
    def finish_taken(self, success: bool) -> None:
        if not self.taken:
            return
        if success:
            self.pq.commit()
            self.unfinished.difference_update(m.queue_offset for m in self.taken)
        else:
            self.pq.make_message_to_consume_again(self.taken)
        self.taken = []

    @invariant()
    def commit_offset_is_safe(self) -> None:
        got = self.pq.committable_offset()
        if self.unfinished:
            assert got == min(self.unfinished)
        elif self.next_offset:
            assert got == self.next_offset
        assert got >= self.last_commit
        self.last_commit = got
        assert self.pq.msg_count == len(self.unfinished)


ProcessQueueMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_process_queue_state_machine = ProcessQueueMachine.TestCase
