"""The two flush gates (compiled ``_codec.FlushGate``, pure-Python ``PyFlushGate``) keep the same contract:
a waiter returns True only once the flushed offset covers its end (or the gate is abandoned by a crash),
False after its timeout, and one release wakes exactly the waiters it covers."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from broker_sim.clock import SystemClock
from broker_sim.store import codec
from broker_sim.store.flush import FlushGate, PyFlushGate
from tests.waiting import wait_until

GATES: list[tuple[str, Callable[[], FlushGate]]] = [("python", lambda: PyFlushGate(SystemClock()))]
if codec.compiled is not None:
    GATES.append(("c", lambda: codec.compiled.FlushGate()))


def waiter(gate: FlushGate, end: int, timeout_s: float, out: dict[int, bool]) -> threading.Thread:
    t = threading.Thread(target=lambda: out.__setitem__(end, gate.wait(end, timeout_s)))
    t.start()
    return t


@pytest.fixture(params=[name for name, _ in GATES])
def gate(request: pytest.FixtureRequest) -> FlushGate:
    g = dict(GATES)[request.param]()
    g.reset(100)
    return g


def test_a_release_wakes_exactly_the_waiters_it_covers(gate: FlushGate) -> None:
    assert gate.wait(100, 0.0) is True  # already on disk: no wait at all
    out: dict[int, bool] = {}
    threads = [waiter(gate, end, 30.0, out) for end in (150, 200, 300)]
    wait_until(lambda: gate.waiting == 3, what="3 waiters")
    assert gate.gather(1.0, 0.0) == 3
    assert gate.release(200) == 2
    wait_until(lambda: len(out) == 2, what="2 waiters answered")
    assert out == {150: True, 200: True}
    assert gate.waiting == 1 and gate.flushed == 200
    assert gate.release(299) == 0 and gate.waiting == 1  # 300 is not covered yet
    assert gate.release(300) == 1
    for t in threads:
        t.join(10)
    assert out == {150: True, 200: True, 300: True}


def test_a_late_flush_times_out_and_withdraws(gate: FlushGate) -> None:
    assert gate.wait(101, 0.05) is False
    assert gate.waiting == 0
    assert gate.release(101) == 0


def test_abandon_releases_everyone_and_stop_ends_gather(gate: FlushGate) -> None:
    out: dict[int, bool] = {}
    threads = [waiter(gate, end, 30.0, out) for end in (500, 600)]
    wait_until(lambda: gate.waiting == 2, what="2 waiters")
    gate.abandon()
    for t in threads:
        t.join(10)
    assert out == {500: True, 600: True} and gate.flushed == 100  # released, but nothing was flushed
    assert gate.gather(30.0, 30.0) == 0  # abandoning also stops the flusher's wait
    gate.reset(0)
    stopper = threading.Timer(0.05, gate.stop)
    stopper.start()
    assert gate.gather(30.0, 30.0) == 0
    stopper.join()


def test_gather_waits_for_the_group_the_last_release_saw(gate: FlushGate) -> None:
    out: dict[int, bool] = {}
    threads = [waiter(gate, 100 + k, 30.0, out) for k in range(1, 5)]
    wait_until(lambda: gate.waiting == 4, what="4 waiters")
    assert gate.release(104) == 4  # four waited around this flush: the next round gathers four
    for t in threads:
        t.join(10)
    late = [waiter(gate, 200 + k, 30.0, out) for k in range(1, 5)]
    assert gate.gather(30.0, 30.0) == 4  # returns as soon as all four are back, long before 30 s
    gate.release(204)
    for t in late:
        t.join(10)
    assert all(out.values()) and len(out) == 8
