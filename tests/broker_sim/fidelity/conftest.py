"""Fixtures for the RocketMQ 4.9.8 fidelity tests: brokers on a small store, and a transport wrapper that
injects broker replies a healthy test broker never gives (SYSTEM_BUSY, slow failures)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_sim import Broker, ManualClock
from broker_sim.common.requests import SendMessageRequest, SendMessageResponse
from broker_sim.common.transport import BrokerTransport

from ..messaging.conftest import SMALL_STORE

__all__ = ["SMALL_STORE", "FaultyTransport"]


class FaultyTransport:
    """The broker's own in-process transport, except that ``send_message`` first runs ``on_send`` (which
    may raise what a real broker or network would) for each attempt; everything else is delegated."""

    def __init__(self, broker: Broker, on_send: Callable[[int], None]) -> None:
        self.inner: BrokerTransport = broker.client_transport()
        self.clock = broker.clock
        self.on_send = on_send
        self.attempts = 0

    def send_message(
        self, request: SendMessageRequest, body: bytes, timeout_ms: int = 3000
    ) -> SendMessageResponse:
        self.attempts += 1
        self.on_send(self.attempts)
        return self.inner.send_message(request, body, timeout_ms)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "store", topics={"T": 4}, **SMALL_STORE).start()
    yield b
    b.shutdown()


@pytest.fixture
def manual_broker(tmp_path: Path, clock: ManualClock) -> Iterator[Broker]:
    b = Broker(tmp_path / "store", topics={"T": 4}, clock=clock, **SMALL_STORE).start()
    yield b
    b.shutdown()
