"""A broker outage must neither spend every due row's send budget nor hold the batch's row locks for a
timeout per row (reliable.sweeper.resend.OutagePause, the probe's memo in reliable.sweeper.triage).

What users saw: the name server down for a quarter of an hour (maintenance) and every message staged meanwhile
ended DEAD — every round had spent one unit of every due row's budget on a refused send —, never sent again
once the broker was back. A master that hung (SIGSTOP, a black-holed address) held the row-lock claim's rows
for a sender timeout per row and a probe timeout per queue: a consumer confirming a message of the healthy
broker waited 46 s behind one batch of 32.
"""

from __future__ import annotations

import pytest

from reliable import Reliability
from reliable import constants as C
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.sweeper import FixedBackoff, Sweeper
from tests.sweeper.helpers import Clock, QueueSender, add_stub, get_inbox, set_progress

BACKOFF = FixedBackoff((10.0,))


class Monotonic:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class DownSender(QueueSender):
    """Refuses every send at once (``hang_s`` 0: a name server down) or after ``hang_s`` (a hung broker:
    the clock moves by that much during the call); ``refused`` ids fail while the broker is otherwise up."""

    def __init__(
        self, mono: Monotonic, hang_s: float = 0.0, refused: tuple[str, ...] | None = None, gone: str = ""
    ) -> None:
        super().__init__()
        self.mono, self.hang_s, self.refused, self.gone = mono, hang_s, refused, gone
        self.calls = 0

    def send(self, message: OutgoingMessage) -> SendReceipt:
        self.calls += 1
        if message.topic == self.gone:
            raise LookupError(f"topic {self.gone} does not exist")
        if self.refused is None or message.message_id in self.refused:
            self.mono.t += self.hang_s
            raise ConnectionError("no route to the broker")
        return super().send(message)


def sweeper(rel: Reliability, sender: QueueSender, clock: Clock, mono: Monotonic, **kw: object) -> Sweeper:
    s = Sweeper(rel, sender, backoff=BACKOFF, clock=clock, **kw)  # type: ignore[arg-type]
    s.monotonic = mono
    return s


def never_sent(rel: Reliability, n: int) -> list[str]:
    ids = [f"m{i:02d}" for i in range(n)]
    for mid in ids:
        add_stub(rel, mid, queue_offset=None, send_count=0)
    return ids


@pytest.mark.parametrize(
    ("hang_s", "tried"), [(0.0, C.SWEEP_PAUSE_AFTER_FAILURES), (3.0, C.SWEEP_PAUSE_AFTER_SLOW_FAILURES)]
)
def test_a_broker_that_refuses_or_hangs_stops_the_rounds_sends_and_spends_no_one_elses_budget(
    rel: Reliability, clock: Clock, hang_s: float, tried: int
) -> None:
    mono = Monotonic()
    sender = DownSender(mono, hang_s=hang_s)
    ids = never_sent(rel, 12)
    s = sweeper(rel, sender, clock, mono, batch=4)  # several batches: the count runs over the round
    summary = s.run_once()
    assert sender.calls == tried and summary.send_failures == tried
    spent = [mid for mid in ids if get_inbox(rel, mid).resend_count > 0]
    assert len(spent) == tried  # the others untouched, still due
    # the broker is back: the next round sends the rest (and what failed, once its backoff has passed)
    sender.refused = ()
    clock.advance(11)
    assert s.run_once().resent == len(ids)
    assert all(
        get_inbox(rel, mid).resend_count >= 1 and get_inbox(rel, mid).last_error is None for mid in ids
    )


def test_one_broken_route_among_healthy_sends_still_spends_its_own_budget(
    rel: Reliability, clock: Clock
) -> None:
    """A refused message between landed ones is that message's problem (an unknown topic, a body the
    broker rejects): it counts, and ends DEAD after max_sends — which tells a person."""
    mono = Monotonic()
    sender = DownSender(mono, refused=("m01", "m03", "m05", "m07"))
    never_sent(rel, 8)
    summary = sweeper(rel, sender, clock, mono).run_once()
    assert (summary.resent, summary.send_failures) == (4, 4)
    assert all(get_inbox(rel, mid).resend_count == 1 for mid in ("m01", "m03", "m05", "m07"))


class HungBroker:
    """A probe whose broker-a hangs (the clock moves by 3 s, no answer); broker-b answers."""

    def __init__(self, mono: Monotonic) -> None:
        self.mono = mono
        self.asked: list[tuple[str, int]] = []

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        self.asked.append((broker_name, queue_id))
        if broker_name == "broker-a":
            self.mono.t += 3.0
            return None
        return 100


def test_a_hung_brokers_queues_are_probed_once_a_round(rel: Reliability, clock: Clock) -> None:
    mono = Monotonic()
    probe = HungBroker(mono)
    for q in range(4):
        for broker in ("broker-a", "broker-b"):
            add_stub(rel, f"{broker}-{q}", queue_id=q, queue_offset=50, broker_name=broker)
            set_progress(rel, 9, queue_id=q, broker_name=broker)  # the group is behind every copy
    sweeper(rel, QueueSender(), clock, mono, probe=probe).run_once()
    # one of its queues (rows due at one instant come in no fixed order), then left alone for this round
    assert len([q for b, q in probe.asked if b == "broker-a"]) == 1
    assert sorted(q for b, q in probe.asked if b == "broker-b") == [0, 1, 2, 3]


def test_a_dead_route_does_not_hold_back_the_healthy_ones_behind_it(rel: Reliability, clock: Clock) -> None:
    """30 due rows of a deleted topic ahead of 10 of a healthy one: the first version of the pause counted
    any three failures in a row and stopped the round — the healthy rows waited ten rounds behind them. Only
    the dead route stops (three of its rows spend their budget each round; it ends DEAD, a person is told);
    the healthy rows go out in the same round."""
    mono = Monotonic()
    sender = DownSender(mono, refused=(), gone="gone")
    for i in range(30):
        add_stub(rel, f"a-gone-{i:02d}", topic="gone", queue_offset=None, send_count=0)
    healthy = [f"b-ok-{i:02d}" for i in range(10)]
    for mid in healthy:
        add_stub(rel, mid, queue_offset=None, send_count=0)
    summary = sweeper(rel, sender, clock, mono, batch=8).run_once()
    assert summary.resent == len(healthy) and summary.send_failures == C.SWEEP_PAUSE_AFTER_FAILURES
    assert sorted(m.message_id for m in sender.sent) == healthy
    assert sender.calls == len(healthy) + C.SWEEP_PAUSE_AFTER_FAILURES
