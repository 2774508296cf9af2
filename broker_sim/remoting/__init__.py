"""RocketMQ remoting protocol for broker_sim: frame codec, name server and broker request handlers, a TCP
server (``broker-sim serve``) and a client transport, so processes — including the real RocketMQ C++
client — can talk to a broker_sim store over the network.

The server (``BrokerSimServer``, ``ServeConfig``, ``RemotingServer``) and the client transport
(``RemotingTransport``) are exported by name but loaded on first use, so a client process does not import
the broker and a server does not import the client stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from broker_sim.remoting.codes import RequestCode, ResponseCode
from broker_sim.remoting.command import RemotingCommand
from broker_sim.remoting.frame import MAX_FRAME_BYTES, FrameDecoder, decode_frame, encode

if TYPE_CHECKING:
    from broker_sim.remoting.client_transport import RemotingTransport
    from broker_sim.remoting.serve import BrokerSimServer, ServeConfig
    from broker_sim.remoting.server import RemotingServer

_LAZY = {
    "RemotingTransport": "broker_sim.remoting.client_transport",
    "BrokerSimServer": "broker_sim.remoting.serve",
    "ServeConfig": "broker_sim.remoting.serve",
    "RemotingServer": "broker_sim.remoting.server",
}

__all__ = [
    "MAX_FRAME_BYTES",
    "BrokerSimServer",
    "FrameDecoder",
    "RemotingCommand",
    "RemotingServer",
    "RemotingTransport",
    "RequestCode",
    "ResponseCode",
    "ServeConfig",
    "decode_frame",
    "encode",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'broker_sim.remoting' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
