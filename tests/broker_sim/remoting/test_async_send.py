"""``Producer.send_async`` over TCP: a window of sends in flight on one connection, outcomes through the
Future and the callbacks, RocketMQ's async failure rules (lost connection → another queue; refusal or
timeout → final, the message may be stored)."""

from __future__ import annotations

import threading
from concurrent.futures import Future, wait

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker_sim import Message, Producer
from broker_sim.client.async_send import WindowGate
from broker_sim.common.errors import InvalidMessageError, RequestTimeoutError, SendFailedError, TransportError
from broker_sim.common.message import SendResult, SendStatus
from tests.broker_sim.remoting.conftest import ServerFactory, running_broker


def test_a_window_of_async_sends_all_land_once(serve: ServerFactory) -> None:
    srv = serve(topics={"T": 4})
    broker = running_broker(srv)
    producer = Producer(srv.namesrv_address, "PA", async_send_window=64)
    successes: list[SendResult] = []
    lock = threading.Lock()

    def on_success(result: SendResult) -> None:
        with lock:
            successes.append(result)

    try:
        futures = [producer.send_async(Message("T", f"m{i}".encode()), on_success) for i in range(500)]
        results = [f.result(30) for f in futures]
    finally:
        producer.shutdown()  # waits for the callback threads
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    assert len({(r.queue_id, r.queue_offset) for r in results}) == 500
    assert {r.queue_id for r in results} == {0, 1, 2, 3}
    assert sorted(r.msg_id for r in successes) == sorted(r.msg_id for r in results)
    stored = sorted(
        m.body for q in range(4) for m in broker.messages("T", q, 0, 500) if m.topic == "T"
    )  # every message stored exactly once
    assert stored == sorted(f"m{i}".encode() for i in range(500))


def test_a_full_window_waits_then_refuses(serve: ServerFactory) -> None:
    """Two sends whose ACKs are lost hold a window of two; a third finds no slot within its timeout and is
    refused as "too many requests" — it was never written. The two time out and are not resent (they are
    stored: a timeout is ambiguous, as for a synchronous send)."""
    srv = serve(topics={"T": 1})
    assert srv.broker is not None
    producer = Producer(srv.namesrv_address, "PW", async_send_window=2)
    try:
        producer.send(Message("T", b"warm-up"))  # route and connection ready
        srv.broker.faults.lose_send_acks(2)
        held = [producer.send_async(Message("T", f"held{i}".encode()), timeout_ms=3000) for i in range(2)]
        refused = producer.send_async(Message("T", b"refused"), timeout_ms=200)
        with pytest.raises(SendFailedError, match="too many requests"):
            refused.result(10)
        assert not any(f.done() for f in held)
        for f in held:
            exc = f.exception(10)
            assert isinstance(exc, SendFailedError) and isinstance(exc.__cause__, RequestTimeoutError)
        assert producer.send(Message("T", b"after")).status is SendStatus.SEND_OK  # window free again
    finally:
        producer.shutdown()
    bodies = [m.body for m in srv.broker.messages("T", 0, 0, 10)]
    assert bodies == [b"warm-up", b"held0", b"held1", b"after"]


def test_async_send_to_a_stopped_broker_fails_through_future_and_callback(serve: ServerFactory) -> None:
    srv = serve(topics={"T": 2})
    producer = Producer(srv.namesrv_address, "PD", send_msg_timeout_ms=2000)
    try:
        producer.send(Message("T", b"x"))
        srv.shutdown()
        failed = threading.Event()
        errors: list[BaseException] = []

        def on_exception(exc: BaseException) -> None:
            errors.append(exc)
            failed.set()

        future = producer.send_async(Message("T", b"y"), on_exception=on_exception)
        exc = future.exception(10)
        assert isinstance(exc, SendFailedError) and isinstance(exc.__cause__, TransportError)
        assert failed.wait(10) and errors == [exc]
    finally:
        producer.shutdown()


def test_a_bad_message_is_reported_not_raised(serve: ServerFactory) -> None:
    srv = serve(topics={"T": 1})
    producer = Producer(srv.namesrv_address, "PB")
    try:
        future: Future[SendResult] = producer.send_async(Message("T", b""))
        assert isinstance(future.exception(5), InvalidMessageError)
        ok = producer.send_async(Message("T", b"fine"))
        done, _ = wait([ok], timeout=10)
        assert done and ok.result().status is SendStatus.SEND_OK
    finally:
        producer.shutdown()


class GateMachine(RuleBasedStateMachine):
    """The window's gate against a model: never more than ``size`` holders; once full, closed until it has
    drained to the low-water mark."""

    def __init__(self) -> None:
        super().__init__()
        self.size = 0
        self.gate: WindowGate | None = None
        self.held = 0
        self.open = True

    @initialize(size=st.integers(1, 40))
    def make(self, size: int) -> None:
        self.size, self.gate = size, WindowGate(size)

    @rule()
    def acquire(self) -> None:
        assert self.gate is not None
        admitted = self.gate.acquire(0)
        assert admitted == (self.open and self.held < self.size)
        if admitted:
            self.held += 1
            if self.held == self.size:
                self.open = False

    @precondition(lambda self: self.held > 0)
    @rule()
    def release(self) -> None:
        assert self.gate is not None
        self.gate.release()
        self.held -= 1
        if self.held <= self.size - max(1, self.size // 4):
            self.open = True

    @invariant()
    def bounded(self) -> None:
        if self.gate is not None:
            assert self.gate.in_flight == self.held <= self.size


TestWindowGate = GateMachine.TestCase


def test_a_waiting_sender_resumes_once_the_window_has_drained() -> None:
    gate = WindowGate(4)  # low-water mark 3
    assert all(gate.acquire(0) for _ in range(4))
    resumed = threading.Event()

    def wait_then_resume() -> None:
        if gate.acquire(10):
            resumed.set()

    threading.Thread(target=wait_then_resume, daemon=True).start()
    gate.release()  # 3 in flight: at the mark, the waiter may go
    assert resumed.wait(10)
    assert gate.in_flight == 4
