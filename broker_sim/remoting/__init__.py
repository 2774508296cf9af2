"""RocketMQ remoting protocol for broker_sim: frame codec, name server and broker request handlers, a TCP
server (``broker-sim serve``) and a client transport, so processes — including the real RocketMQ C++
client — can talk to a broker_sim store over the network."""

from __future__ import annotations

from broker_sim.remoting.client_transport import RemotingTransport
from broker_sim.remoting.codes import RequestCode, ResponseCode
from broker_sim.remoting.command import RemotingCommand
from broker_sim.remoting.frame import MAX_FRAME_BYTES, FrameDecoder, decode_frame, encode
from broker_sim.remoting.serve import BrokerSimServer, ServeConfig
from broker_sim.remoting.server import RemotingServer

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
