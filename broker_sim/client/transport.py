"""Which transport a client uses: :func:`transport_for` turns what a user passed (an in-process Broker, a
``"host:port"`` name server address, or a ready transport) into a
:class:`~broker_sim.common.transport.BrokerTransport`. The protocol itself lives in
:mod:`broker_sim.common.transport`; it is re-exported here for code written against this path."""

from __future__ import annotations

import importlib

from broker_sim.common.transport import (
    BrokerTransport as BrokerTransport,
)
from broker_sim.common.transport import (
    PullCallback as PullCallback,
)
from broker_sim.common.transport import (
    TransportFactory,
)


def transport_for(broker_or_address: object) -> BrokerTransport:
    """The transport for what a user passed: a Broker, a ready transport, or a ``"host:port"`` name server
    (several as ``"host:port;host:port"``, as RocketMQ's ``namesrvAddr``)."""
    if isinstance(broker_or_address, TransportFactory):
        return broker_or_address.client_transport()
    if isinstance(broker_or_address, str):
        for addr in broker_or_address.split(";"):
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"broker address must be 'host:port[;host:port]', got {broker_or_address!r}")
        # Imported lazily (and by name, so this module never depends on the network layer being present).
        module = importlib.import_module("broker_sim.remoting.client_transport")
        transport: BrokerTransport = module.RemotingTransport(broker_or_address)
        return transport
    if isinstance(broker_or_address, BrokerTransport):
        return broker_or_address
    raise TypeError(
        f"expected a Broker, a 'host:port' string or a BrokerTransport, got {broker_or_address!r}"
    )


def __getattr__(name: str) -> object:
    """``InProcessTransport`` moved to :mod:`broker_sim.broker.in_process` (the client package no longer
    imports the broker); the old name still resolves, loaded on first use."""
    if name == "InProcessTransport":
        return importlib.import_module("broker_sim.broker.in_process").InProcessTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
