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
from reliable.send_breaker import SendBreaker
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
_events = st.lists(
    st.tuples(st.sampled_from(["ok", "fast", "slow"]), st.floats(min_value=0.0, max_value=30.0)), max_size=30
)


@settings(max_examples=200, deadline=None)
@given(_events)
def test_the_breaker_is_open_exactly_within_retry_after_of_the_last_slow_failure(
    events: list[tuple[str, float]],
) -> None:
    mono = Monotonic()
    breaker = SendBreaker(slow_s=1.0, retry_after_s=10.0, clock=mono)
    open_until = None  # the model
    for outcome, gap in events:
        mono.t += gap
        started = mono.t
        mono.t += 2.0 if outcome == "slow" else 0.1
        breaker.record(started, outcome == "ok")
        if outcome == "ok":
            open_until = None
        elif outcome == "slow":
            open_until = mono.t + 10.0
        assert breaker.open() == (open_until is not None and mono.t < open_until)
