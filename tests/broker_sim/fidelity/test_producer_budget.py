"""Producer send retries as in RocketMQ 4.9.8's ``DefaultMQProducerImpl.sendDefaultImpl``: one timeout budget
(3 s) shared by every attempt, retries only for ``DefaultMQProducer.retryResponseCodes``."""

from __future__ import annotations

import pytest

from broker_sim import Broker, ManualClock, Message, Producer
from broker_sim.common.errors import BrokerResponseError, SendFailedError, SystemBusyError, TransportError

from .conftest import FaultyTransport


def test_system_busy_is_not_retried(broker: Broker) -> None:
    """DefaultMQProducer.retryResponseCodes (4.9.8) lacks SYSTEM_BUSY: a busy broker's refusal is final."""

    def busy(attempt: int) -> None:
        raise SystemBusyError("[PC_SYNCHRONIZED]broker busy, start flow control for a while")

    t = FaultyTransport(broker, busy)
    p = Producer(t, "P")
    with pytest.raises(SendFailedError, match="busy"):
        p.send(Message("T", b"x"))
    assert t.attempts == 1
    p.shutdown()


def test_system_error_is_retried_on_another_queue(broker: Broker) -> None:
    """SYSTEM_ERROR (1) is in DefaultMQProducer.retryResponseCodes: the next attempt succeeds."""

    def first_fails(attempt: int) -> None:
        if attempt == 1:
            raise BrokerResponseError("store error", 1)

    t = FaultyTransport(broker, first_fails)
    p = Producer(t, "P")
    assert p.send(Message("T", b"x")).queue_offset == 0
    assert t.attempts == 2
    p.shutdown()


def test_attempts_share_one_budget(manual_broker: Broker, clock: ManualClock) -> None:
    """sendDefaultImpl: each attempt gets ``timeout - elapsed``; once the 3 s are used up the send fails with
    "call timeout" (RemotingTooMuchRequestException) instead of making the third attempt."""

    def slow_failure(attempt: int) -> None:
        clock.advance(1.6)
        raise TransportError("connection reset")

    t = FaultyTransport(manual_broker, slow_failure)
    p = Producer(t, "P", retry_times_when_send_failed=2, send_msg_timeout_ms=3000)
    with pytest.raises(SendFailedError, match="call timeout"):
        p.send(Message("T", b"x"))
    assert t.attempts == 2  # 0 ms → 1600 ms → 3200 ms ≥ 3000: no third attempt
    p.shutdown()


def test_quick_failures_use_every_attempt(manual_broker: Broker) -> None:
    """With budget left, a failed connection is retried at once, up to 1 + retryTimesWhenSendFailed times."""

    def always_fails(attempt: int) -> None:
        raise TransportError("connection refused")

    t = FaultyTransport(manual_broker, always_fails)
    p = Producer(t, "P", retry_times_when_send_failed=2)
    with pytest.raises(SendFailedError, match="after 3 attempts"):
        p.send(Message("T", b"x"))
    assert t.attempts == 3
    p.shutdown()


def test_batch_sends_share_the_budget_too(broker: Broker) -> None:
    """A batch goes through sendDefaultImpl as well: its lost ACK is not retried either."""
    p = Producer(broker, "P")
    broker.faults.lose_send_acks(1)
    with pytest.raises(SendFailedError, match="call timeout"):
        p.send_batch([Message("T", b"a", keys="bk"), Message("T", b"b", keys="bk")])
    assert len(broker.query_message_by_key("T", "bk")) == 2  # the one batch, stored once
    p.shutdown()
