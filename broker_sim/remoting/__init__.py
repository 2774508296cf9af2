"""RocketMQ remoting protocol for broker_sim: frame codec, name server and broker request handlers, a TCP
server (``broker-sim serve``) and a client transport, so processes — including the real RocketMQ C++
client — can talk to a broker_sim store over the network."""

from __future__ import annotations

from broker_sim.remoting.codes import RequestCode, ResponseCode
from broker_sim.remoting.frame import MAX_FRAME_BYTES, FrameDecoder, RemotingCommand, decode_frame, encode

__all__ = [
    "MAX_FRAME_BYTES",
    "FrameDecoder",
    "RemotingCommand",
    "RequestCode",
    "ResponseCode",
    "decode_frame",
    "encode",
]
