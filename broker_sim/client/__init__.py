"""Clients: producer, push and pull consumers, over a
:class:`~broker_sim.common.transport.BrokerTransport` (in-process Broker or ``"host:port"``)."""

from __future__ import annotations

from broker_sim.common.message import (
    ConsumeOrderlyStatus,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    MessageQueue,
    SendResult,
    SendStatus,
)

__all__ = [
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "LocalTransactionState",
    "Message",
    "MessageExt",
    "MessageQueue",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "SendResult",
    "SendStatus",
    "TransactionProducer",
]
