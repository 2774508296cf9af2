"""Offsets of another broker group's queues, for a 5.x QueryOffset that names that group.

Each broker_sim broker runs its own 5.x front end, but a message queue is ``(topic, broker name, queue id)``:
on a cluster of two groups queue 0 of ``broker-b`` is not queue 0 of ``broker-a``. The 5.x proxy answers a
QueryOffset by the broker name in its message queue — it looks the name up in the topic's route (from the
name servers), asks that group's broker, and answers ``BAD_REQUEST`` ("cannot find broker …") when the route
has no such group. A front end asked about another group does the same here: the route and the offset come
over the remoting protocol from the cluster's name servers, as any 4.x client would get them, so the answer
is the other broker's own (its master's, or its slave's while the master is down).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from broker_sim.errors import BrokerSimError
from broker_sim.remoting.client_transport import RemotingTransport


class UnknownBrokerError(BrokerSimError):
    """The topic's route names no broker group of that name."""


class QueueOffsets(Protocol):
    """A broker group's offset questions about its own queues (a ``Broker`` answers them)."""

    def get_min_offset(self, topic: str, queue_id: int) -> int: ...

    def get_max_offset(self, topic: str, queue_id: int) -> int: ...

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int: ...


@dataclass(frozen=True)
class _RemoteGroup:
    """One other broker group's offsets, asked over the remoting protocol."""

    transport: RemotingTransport
    broker_name: str

    def get_min_offset(self, topic: str, queue_id: int) -> int:
        return self.transport.get_min_offset(topic, queue_id, self.broker_name)

    def get_max_offset(self, topic: str, queue_id: int) -> int:
        return self.transport.get_max_offset(topic, queue_id, self.broker_name)

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return self.transport.search_offset_by_timestamp(topic, queue_id, timestamp_ms, self.broker_name)


class PeerGroups:
    """The other broker groups of the cluster whose name servers are ``namesrv_addrs``; the connection is
    made on the first question (most front ends are never asked about another group)."""

    def __init__(self, namesrv_addrs: Sequence[str], request_timeout_ms: int = 3000) -> None:
        self._namesrvs = ";".join(namesrv_addrs)
        self._timeout_ms = request_timeout_ms
        self._lock = threading.Lock()
        self._transport: RemotingTransport | None = None

    def _connected(self) -> RemotingTransport:
        with self._lock:
            if self._transport is None:
                self._transport = RemotingTransport(self._namesrvs, request_timeout_ms=self._timeout_ms)
            return self._transport

    def group(self, topic: str, broker_name: str) -> QueueOffsets:
        """``broker_name``'s offsets of ``topic``; raises ``TopicNotExistError`` for a topic no name server
        routes, :class:`UnknownBrokerError` when its route has no group ``broker_name``."""
        transport = self._connected()
        route = transport.get_route(topic)
        if all(b.broker_name != broker_name for b in route.broker_datas):
            raise UnknownBrokerError(f"cannot find broker {broker_name} in the route of topic {topic}")
        return _RemoteGroup(transport, broker_name)

    def close(self) -> None:
        with self._lock:
            transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()
