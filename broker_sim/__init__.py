"""broker_sim: a file-backed broker that behaves like RocketMQ 4.x (disk formats, wire protocol, client
behaviour), with a controllable clock and a fault injector. It never imports :mod:`reliable`.

In-process API (DESIGN.md §6)::

    from broker_sim import Broker, Producer, PushConsumer, PullConsumer, Message, ConsumeStatus
    broker = Broker(store_dir, topics={"T": 4}); broker.start()
    Producer(broker, "P").send(Message("T", b"body", keys="k1", tags="A"))
    PushConsumer(broker, "G").subscribe("T", "*", listener).start()   # listener(msgs) -> ConsumeStatus

Pass ``"host:port"`` instead of a Broker to talk to ``broker-sim serve`` over TCP. Names are resolved lazily
so that importing a subpackage (e.g. the store) does not import the whole messaging layer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker_sim.broker.broker import Broker
    from broker_sim.client.allocate import average, average_by_circle, consistent_hash, machine_room
    from broker_sim.client.producer import Producer
    from broker_sim.client.pull_consumer import PullConsumer, PullResult
    from broker_sim.client.push_consumer import PushConsumer
    from broker_sim.client.transaction_producer import TransactionProducer
    from broker_sim.clock import ManualClock, SystemClock
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
    from broker_sim.common.requests import ConsumeFromWhere, ExpressionType, MessageModel, MessageSelector
    from broker_sim.faults import FaultInjector

_EXPORTS = {
    "Broker": "broker_sim.broker.broker",
    "ConsumeFromWhere": "broker_sim.common.requests",
    "ExpressionType": "broker_sim.common.requests",
    "MessageSelector": "broker_sim.common.requests",
    "MessageModel": "broker_sim.common.requests",
    "average": "broker_sim.client.allocate",
    "average_by_circle": "broker_sim.client.allocate",
    "consistent_hash": "broker_sim.client.allocate",
    "machine_room": "broker_sim.client.allocate",
    "ConsumeOrderlyStatus": "broker_sim.common.message",
    "ConsumeStatus": "broker_sim.common.message",
    "LocalTransactionState": "broker_sim.common.message",
    "Message": "broker_sim.common.message",
    "MessageExt": "broker_sim.common.message",
    "MessageQueue": "broker_sim.common.message",
    "SendResult": "broker_sim.common.message",
    "SendStatus": "broker_sim.common.message",
    "Producer": "broker_sim.client.producer",
    "PullConsumer": "broker_sim.client.pull_consumer",
    "PullResult": "broker_sim.client.pull_consumer",
    "PushConsumer": "broker_sim.client.push_consumer",
    "TransactionProducer": "broker_sim.client.transaction_producer",
    "ManualClock": "broker_sim.clock",
    "SystemClock": "broker_sim.clock",
    "FaultInjector": "broker_sim.faults",
}

__all__ = [
    "Broker",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "ExpressionType",
    "FaultInjector",
    "LocalTransactionState",
    "ManualClock",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "MessageSelector",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "SendResult",
    "SendStatus",
    "SystemClock",
    "TransactionProducer",
    "average",
    "average_by_circle",
    "consistent_hash",
    "machine_room",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'broker_sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
