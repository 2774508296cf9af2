"""Pop consumption (the 5.x front end's core) as a state machine against a model, on a manual clock.

What a 5.x consumer relies on, whatever it does in whatever order: an acked message never comes back; a
message is never handed out while it is invisible; each delivery's attempt is the previous one + 1; a handle
that was replaced (redelivered, extended) or has expired is refused; past max attempts a message goes to the
DLQ instead of being delivered; nothing is lost — in the end every message was acked or dead-lettered.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker_sim import Broker, ManualClock
from broker_sim.broker.api import SendMessageRequest
from broker_sim.client.message import Prop
from broker_sim.grpc.policy import GroupPolicies, GroupPolicy
from broker_sim.grpc.pop import MESSAGE_GROUP, PopService
from broker_sim.grpc.receipt import InvalidReceiptHandleError, ReceiptHandle
from broker_sim.store.results import GetMessageStatus
from tests.broker_sim.messaging.conftest import SMALL_STORE

TOPIC, GROUP, MESSAGES, MAX_ATTEMPTS = "P", "g", 6, 3


class PopMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.dir = Path(tempfile.mkdtemp())
        self.clock = ManualClock()
        self.broker = Broker(self.dir / "store", topics={TOPIC: 2}, clock=self.clock, **SMALL_STORE).start()
        policies = GroupPolicies(self.dir / "policies.json")
        policies.set(GROUP, GroupPolicy(max_attempts=MAX_ATTEMPTS, backoff_s=(1,)))
        self.pop = PopService(self.broker, policies)
        for i in range(MESSAGES):
            self.broker.send_message(
                SendMessageRequest("p", TOPIC, i % 2, properties={Prop.UNIQ_KEY: f"m{i}"}), f"m{i}".encode()
            )
        self.attempts: dict[str, int] = {}
        self.current: dict[str, ReceiptHandle] = {}  # message -> live handle
        self.old: list[ReceiptHandle] = []
        self.acked: set[str] = set()

    def teardown(self) -> None:
        if hasattr(self, "broker"):
            self.broker.shutdown()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _now(self) -> int:
        return self.clock.now_ms()

    @rule(n=st.integers(1, 4), invisible_s=st.sampled_from([5, 10]))
    def receive(self, n: int, invisible_s: int) -> None:
        for d in self.pop.pop(GROUP, TOPIC, n, invisible_s * 1000):
            mid = d.message.uniq_key or ""
            assert mid not in self.acked, "an acked message came back"
            live = self.current.get(mid)
            assert live is None or live.expires_ms <= self._now(), "delivered while invisible"
            assert d.attempt == self.attempts.get(mid, 0) + 1
            assert d.attempt <= MAX_ATTEMPTS
            self.attempts[mid] = d.attempt
            if live is not None:
                self.old.append(live)
            self.current[mid] = d.handle

    @precondition(lambda self: bool(self.current))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        mid = data.draw(st.sampled_from(sorted(self.current)))
        handle = self.current[mid]
        if handle.expires_ms <= self._now():
            with pytest.raises(InvalidReceiptHandleError):
                self.pop.ack(GROUP, TOPIC, handle.encode())
            return
        self.pop.ack(GROUP, TOPIC, handle.encode())
        self.acked.add(mid)
        del self.current[mid]
        self.old.append(handle)

    @precondition(lambda self: bool(self.current))
    @rule(data=st.data(), seconds=st.integers(1, 20))
    def change_invisible(self, data: st.DataObject, seconds: int) -> None:
        mid = data.draw(st.sampled_from(sorted(self.current)))
        handle = self.current[mid]
        if handle.expires_ms <= self._now():
            with pytest.raises(InvalidReceiptHandleError):
                self.pop.change_invisible(GROUP, TOPIC, handle.encode(), seconds * 1000)
            return
        self.current[mid] = self.pop.change_invisible(GROUP, TOPIC, handle.encode(), seconds * 1000)
        self.old.append(handle)

    @precondition(lambda self: bool(self.old))
    @rule(data=st.data())
    def stale_handle_is_refused(self, data: st.DataObject) -> None:
        handle = data.draw(st.sampled_from(self.old))
        with pytest.raises(InvalidReceiptHandleError):
            self.pop.ack(GROUP, TOPIC, handle.encode())

    @rule(seconds=st.integers(1, 12))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    def dead_lettered(self) -> set[str]:
        self.broker.store.wait_dispatched(5.0)  # the DLQ copy's consume-queue entry is written by a thread
        r = self.broker.store.get_message("inspect", f"%DLQ%{GROUP}", 0, 0, 32, None)
        return {s.ext.uniq_key or "" for s in r.messages} if r.status is GetMessageStatus.FOUND else set()

    @invariant()
    def committed_offset_never_passes_an_unfinished_message(self) -> None:
        if not hasattr(self, "broker"):
            return
        unfinished = {f"m{i}" for i in range(MESSAGES)} - self.acked - self.dead_lettered()
        for qid in (0, 1):
            floor = self.broker.query_consumer_offset(GROUP, TOPIC, qid) or 0
            assert all(int(m[1:]) // 2 >= floor for m in unfinished if int(m[1:]) % 2 == qid)

    def check_nothing_lost(self) -> None:
        """Drain: advance far and pop until quiet; every message ends acked or in the DLQ."""
        for _ in range(MAX_ATTEMPTS + 2):
            self.clock.advance(60)
            for d in self.pop.pop(GROUP, TOPIC, 32, 1000):
                assert (d.message.uniq_key or "") not in self.acked
        dlq = self.dead_lettered()
        assert not dlq & self.acked
        assert dlq | self.acked == {f"m{i}" for i in range(MESSAGES)}


class DrainingPopMachine(PopMachine):
    def teardown(self) -> None:
        if hasattr(self, "broker"):
            self.check_nothing_lost()
        super().teardown()


DrainingPopMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_pop_state_machine = DrainingPopMachine.TestCase


_ints = st.integers(0, 2**63 - 1)


@given(
    st.builds(ReceiptHandle, _ints, _ints, _ints, st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True),
              st.integers(0, 2**31 - 1), _ints, _ints, _ints)
)  # fmt: skip
def test_receipt_handle_round_trip(h: ReceiptHandle) -> None:
    assert ReceiptHandle.decode(h.encode()) == h
    parts = h.encode().split(" ")
    assert (parts[6], parts[7]) == (str(h.queue_id), str(h.queue_offset))  # RocketMQ's positions


def test_malformed_receipt_handle_is_refused() -> None:
    with pytest.raises(InvalidReceiptHandleError):
        ReceiptHandle.decode("1 2 3")


@pytest.mark.parametrize("one_per_message_group", [True, False])
def test_a_fifo_receive_hands_out_one_message_of_each_message_group(
    tmp_path: Path, one_per_message_group: bool
) -> None:
    """One receive with room for all: a FIFO group gets the first message of each message group, the next
    one only after it is acked — a message group was blocked only by a message delivered earlier, so one
    receive carried S-1, S-2 and S-3 together and a consumer retrying S-1 had S-2 and S-3 in hand to apply
    first. Turned off (as an Apache broker's orderly pop, which holds the whole queue instead), a receive
    carries a message group's run in queue order."""
    clock = ManualClock()
    broker = Broker(tmp_path / "store", topics={TOPIC: 1}, clock=clock, **SMALL_STORE).start()
    try:
        policies = GroupPolicies(tmp_path / "policies.json")
        policies.set(GROUP, GroupPolicy(fifo=True))
        pop = PopService(broker, policies)
        pop.fifo_one_per_message_group = one_per_message_group
        for key, message_group in [("S-1", "G1"), ("S-2", "G1"), ("T-1", "G2"), ("S-3", "G1")]:
            props = {Prop.UNIQ_KEY: key, MESSAGE_GROUP: message_group}
            broker.send_message(SendMessageRequest("p", TOPIC, 0, properties=props), key.encode())
        assert broker.store.wait_dispatched(5.0)

        def receive() -> list[str]:
            return [d.message.uniq_key or "" for d in pop.pop(GROUP, TOPIC, 16, 10_000)]

        if not one_per_message_group:
            assert receive() == ["S-1", "S-2", "T-1", "S-3"]
            return
        first = pop.pop(GROUP, TOPIC, 16, 10_000)
        assert [d.message.uniq_key for d in first] == ["S-1", "T-1"]
        assert receive() == []  # S-2 waits for S-1
        for d in first:
            pop.ack(GROUP, TOPIC, d.handle.encode())
        assert receive() == ["S-2"]
        clock.advance(11)  # S-2 not acked in time: delivered again before S-3
        assert receive() == ["S-2"]
    finally:
        broker.shutdown()


def test_a_forward_to_the_dlq_copies_on_any_handle_and_finishes_only_on_the_current_one(
    tmp_path: Path,
) -> None:
    """The 5.x proxy forwards by the handle's commit-log offset without checking the handle, then acks with
    it and ignores a failed ack. broker_sim refused a stale handle instead, so a consumer forwarding on one
    looked fine against it and made a DLQ copy per forward against a real proxy. Now: a copy on a stale or
    expired handle too, the delivery left to its current holder; a copy and the delivery finished on the
    current handle; a malformed handle refused."""
    clock = ManualClock()
    broker = Broker(tmp_path / "store", topics={TOPIC: 1}, clock=clock, **SMALL_STORE).start()
    try:
        policies = GroupPolicies(tmp_path / "policies.json")
        policies.set(GROUP, GroupPolicy(fifo=True))
        pop = PopService(broker, policies)
        props = {Prop.UNIQ_KEY: "D-1", MESSAGE_GROUP: "G1"}
        broker.send_message(SendMessageRequest("p", TOPIC, 0, properties=props), b"d")
        assert broker.store.wait_dispatched(5.0)

        def dlq() -> int:
            broker.store.wait_dispatched(5.0)
            return broker.get_max_offset(f"%DLQ%{GROUP}", 0)

        (first,) = pop.pop(GROUP, TOPIC, 1, 10_000)
        clock.advance(11)
        assert pop.forward_to_dlq(GROUP, TOPIC, first.handle.encode()) is False  # expired: copied, in flight
        assert dlq() == 1
        (second,) = pop.pop(GROUP, TOPIC, 1, 10_000)
        assert second.attempt == 2
        assert pop.forward_to_dlq(GROUP, TOPIC, first.handle.encode()) is False  # stale: copied again
        assert dlq() == 2 and len(pop.inflight(GROUP, TOPIC)) == 1
        assert pop.forward_to_dlq(GROUP, TOPIC, second.handle.encode()) is True
        assert dlq() == 3 and pop.inflight(GROUP, TOPIC) == {}
        with pytest.raises(InvalidReceiptHandleError):
            pop.forward_to_dlq(GROUP, TOPIC, "1 2 3")
    finally:
        broker.shutdown()
