"""A hanging broker must not stall the caller of the after-commit sends (reliable.send_breaker).

A consumer that stages one follow-up per message, with the outbound broker hanging, waited one sender
timeout per message in its loop. After a send that failed slowly the after-commit sends are left to the
sweeper for a while: their stubs are committed, so nothing is lost; explicit ``send_staged`` calls still try.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session

from reliable import Envelope, Reason, Reliability, StubProducer, StubStatus, idempotent_consumer
from reliable import constants as C
from reliable.send_breaker import Pass, SendBreaker
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.staged import SendOutcome
from tests.conftest import _ensure_clean_schema
from tests.core.guard_helpers import apply, env, make_rel
from tests.core.producer.support import Clock, RecordingSender, stub


class Monotonic:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class HangingSender(RecordingSender):
    """Times out (the clock moves by ``timeout_s`` during the call) while ``hanging``; fails fast while
    ``broken``; else accepts."""

    def __init__(self, mono: Monotonic, timeout_s: float = 3.0) -> None:
        super().__init__()
        self.mono = mono
        self.timeout_s = timeout_s
        self.hanging = False
        self.calls = 0

    def send(self, message: OutgoingMessage) -> SendReceipt:
        self.calls += 1
        if self.hanging:
            self.mono.t += self.timeout_s
            raise TimeoutError("no answer from the broker in 3 s")
        return super().send(message)


@pytest.fixture
def rel(db_url: str) -> Iterator[Reliability]:
    r = Reliability(db_url)
    yield r
    r.close()


def _producer(
    rel: Reliability, sender: RecordingSender, mono: Monotonic, default_group: str = "billing"
) -> StubProducer:
    producer = StubProducer(rel, sender, default_group=default_group, clock=Clock())
    producer.breaker = SendBreaker(clock=mono)
    return producer


def _stage_and_commit(rel: Reliability, producer: StubProducer, message_id: str) -> None:
    with rel.session() as s:
        producer.stage(s, message_id, "orders", b"{}")


def test_after_one_hung_send_the_next_ones_are_left_to_the_sweeper_then_tried_again(rel: Reliability) -> None:
    mono = Monotonic()
    sender = HangingSender(mono)
    producer = _producer(rel, sender, mono)
    sender.hanging = True
    _stage_and_commit(rel, producer, "hb-1")
    assert sender.calls == 1  # tried, and waited for the timeout
    for mid in ("hb-2", "hb-3"):
        _stage_and_commit(rel, producer, mid)
    assert sender.calls == 1  # not one timeout per message
    first, deferred = stub(rel, "hb-1"), stub(rel, "hb-2")
    assert first is not None and first.send_count == 1 and first.last_error is not None
    # committed, untouched: PENDING and due at its staged time, so the sweeper sends it
    assert deferred is not None and deferred.status is StubStatus.PENDING and deferred.send_count == 0
    assert deferred.queue_offset is None and deferred.resend_at is not None
    # the broker is back and the interval is over: the next after-commit send is tried and lands
    sender.hanging = False
    mono.t += C.PRODUCER_SEND_RETRY_AFTER_S + 0.1
    _stage_and_commit(rel, producer, "hb-4")
    _stage_and_commit(rel, producer, "hb-5")
    assert [m.message_id for m in sender.sent] == ["hb-4", "hb-5"]


def test_a_send_that_fails_fast_defers_nothing(rel: Reliability) -> None:
    mono = Monotonic()
    sender = HangingSender(mono)
    producer = _producer(rel, sender, mono)
    sender.broken = True  # refused at once: costs the caller nothing
    for mid in ("ff-1", "ff-2", "ff-3"):
        _stage_and_commit(rel, producer, mid)
    assert sender.calls == 3
    row = stub(rel, "ff-3")
    assert row is not None and row.send_count == 1


def test_an_explicit_send_is_tried_even_while_after_commit_sends_are_deferred(rel: Reliability) -> None:
    mono = Monotonic()
    sender = HangingSender(mono)
    producer = _producer(rel, sender, mono)
    sender.hanging = True
    _stage_and_commit(rel, producer, "ex-1")
    assert producer.breaker.open()
    with rel.session() as s:
        staged = producer.stage(s, "ex-2", "orders", b"{}", send_on_commit=False)
    sender.hanging = False
    [result] = producer.send_staged(staged)
    assert result.outcome is SendOutcome.SENT and sender.calls == 2
    assert not producer.breaker.open()  # a landed send closes it


def test_a_guarded_handlers_follow_ups_do_not_wait_for_a_hanging_broker(
    db_url: str, redis_url: str, key_prefix: str
) -> None:
    _ensure_clean_schema(db_url)
    rel = make_rel(db_url, redis_url, key_prefix)
    try:
        mono = Monotonic()
        sender = HangingSender(mono)
        producer = _producer(rel, sender, mono, default_group="shipping")
        sender.hanging = True

        @idempotent_consumer(rel, group="billing")
        def handle(e: Envelope, session: Session) -> None:
            apply(e, session)
            producer.stage(session, f"ship-{e.message_id}", "shipments", e.body)

        decisions = [handle.decide(env(f"o-{i}")) for i in range(4)]
        assert all(d.reason is Reason.PROCESSED for d in decisions)
        assert sender.calls == 1
        for i in range(4):
            row = stub(rel, f"ship-o-{i}")
            assert row is not None and row.status is StubStatus.PENDING  # the sweeper's to send
    finally:
        rel.close()


# --- the breaker alone, as a state machine ------------------------------------------------------------
# ("admit", outcome, gap): an after-commit send asks to go; if let through it stays in flight with that
# outcome. ("finish", "", gap): the oldest send in flight ends (taking 2 s if slow, 0.1 s else).
_events = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.sampled_from(["ok", "fast", "slow"]), st.floats(0.0, 30.0)),
        st.tuples(st.just("finish"), st.just(""), st.floats(0.0, 30.0)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_events)
def test_the_breaker_defers_within_retry_after_of_a_slow_failure_and_lets_one_trial_out_after(
    events: list[tuple[str, str, float]],
) -> None:
    mono = Monotonic()
    breaker = SendBreaker(slow_s=1.0, retry_after_s=10.0, clock=mono)
    open_until: float | None = None  # the model: None = closed
    trial_out_since: float | None = None
    in_flight: list[tuple[Pass, str, float]] = []
    for kind, outcome, gap in events:
        mono.t += gap
        if kind == "admit":
            got = breaker.admit()
            if open_until is None:
                want = Pass.SEND
            elif mono.t < open_until or (trial_out_since is not None and mono.t < trial_out_since + 10.0):
                want = Pass.DEFER  # tripped, or another send is the trial: one timeout per interval
            else:
                want = Pass.TRIAL
            assert got is want
            if got is Pass.TRIAL:
                trial_out_since = mono.t
            if got is not Pass.DEFER:
                in_flight.append((got, outcome, mono.t))
        elif in_flight:
            admitted, outcome, started = in_flight.pop(0)
            mono.t += 2.0 if outcome == "slow" else 0.1
            trial = admitted is Pass.TRIAL
            breaker.record(started, outcome == "ok", trial=trial)
            slow = outcome != "ok" and mono.t - started >= 1.0
            if trial:
                trial_out_since = None
            if outcome == "ok" or (trial and not slow):
                open_until = None
            elif slow:
                open_until = mono.t + 10.0
        assert breaker.open() == (open_until is not None)


def test_after_the_interval_one_send_is_the_trial_and_the_others_stay_deferred_until_it_ends() -> None:
    """Twenty consumer threads and a broker still hanging when the interval ends: one more timeout, not
    twenty."""
    mono = Monotonic()
    breaker = SendBreaker(slow_s=1.0, retry_after_s=10.0, clock=mono)
    breaker.record(mono.t - 3.0, ok=False)  # one send hung for 3 s
    assert breaker.admit() is Pass.DEFER
    mono.t += 10.0
    assert [breaker.admit() for _ in range(20)] == [Pass.TRIAL] + [Pass.DEFER] * 19
    started = mono.t
    mono.t += 3.0
    breaker.record(started, ok=False, trial=True)  # the broker still hangs: another interval
    assert breaker.admit() is Pass.DEFER
    mono.t += 10.0
    assert breaker.admit() is Pass.TRIAL
    breaker.record(mono.t, ok=True, trial=True)
    assert [breaker.admit() for _ in range(3)] == [Pass.SEND] * 3 and not breaker.open()
