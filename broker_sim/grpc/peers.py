"""Offsets of another broker group's queues, for a 5.x QueryOffset that names that group.

Each broker_sim broker runs its own 5.x front end, but a message queue is ``(topic, broker name, queue id)``:
on a cluster of two groups queue 0 of ``broker-b`` is not queue 0 of ``broker-a``. The 5.x proxy answers a
QueryOffset by the broker name in its message queue — it looks the name up in the topic's route (from the
name servers), asks that group's broker, and answers ``BAD_REQUEST`` ("cannot find broker …") when the route
has no such group. A front end asked about another group does the same here: the route and the offset come
over the remoting protocol from the cluster's name servers, as any 4.x client would get them, so the answer
is the other broker's own (its master's, or its slave's while the master is down).

QueryRoute and QueryAssignment are cluster-wide the same way (:meth:`PeerGroups.queues`): a 5.x client gets a
topic's whole route from any endpoint, so each other group's queues (from the name servers' route) are
listed with the endpoint of *that group's* front end — the address its broker announces in its runtime info
(``GRPC_ENDPOINT_KEY``), as a 5.x proxy in local mode answers with each broker's own proxy. A group whose
broker has no 5.x front end, or does not answer, is left out (logged): a 5.x client could not reach it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from broker_sim.broker.admin_clients import GRPC_ENDPOINT_KEY
from broker_sim.errors import BrokerSimError
from broker_sim.remoting.admin_client import AdminClient
from broker_sim.remoting.client_transport import RemotingTransport

log = logging.getLogger("broker_sim.grpc.peers")


class UnknownBrokerError(BrokerSimError):
    """The topic's route names no broker group of that name."""


class QueueOffsets(Protocol):
    """A broker group's offset questions about its own queues (a ``Broker`` answers them)."""

    def get_min_offset(self, topic: str, queue_id: int) -> int: ...

    def get_max_offset(self, topic: str, queue_id: int) -> int: ...

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int: ...


@dataclass(frozen=True)
class GroupQueues:
    """One broker group's queues of a topic, as a 5.x route lists them."""

    broker_name: str
    broker_id: int
    #: "host:port" of the group's 5.x front end; "" = the endpoint the client asked (this front end)
    endpoint: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int  # RocketMQ's PermName bits


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
    made on the first question (a front end of a one-group cluster is asked no such question)."""

    def __init__(self, namesrv_addrs: Sequence[str], request_timeout_ms: int = 3000) -> None:
        self._namesrvs = ";".join(namesrv_addrs)
        self._timeout_ms = request_timeout_ms
        self._lock = threading.Lock()
        self._admin: AdminClient | None = None

    def _connected(self) -> AdminClient:
        with self._lock:
            if self._admin is None:
                self._admin = AdminClient(self._namesrvs, request_timeout_ms=self._timeout_ms)
            return self._admin

    def group(self, topic: str, broker_name: str) -> QueueOffsets:
        """``broker_name``'s offsets of ``topic``; raises ``TopicNotExistError`` for a topic no name server
        routes, :class:`UnknownBrokerError` when its route has no group ``broker_name``."""
        transport = self._connected().transport
        route = transport.get_route(topic)
        if all(b.broker_name != broker_name for b in route.broker_datas):
            raise UnknownBrokerError(f"cannot find broker {broker_name} in the route of topic {topic}")
        return _RemoteGroup(transport, broker_name)

    def queues(self, topic: str, exclude: str) -> list[GroupQueues]:
        """The queues of ``topic`` on every group of its route but ``exclude`` (this front end's), in broker
        name order, each with its group's 5.x endpoint (the master's front end; a slave's while the group
        has no master). Raises ``TopicNotExistError`` for a topic no name server routes."""
        admin = self._connected()
        route = admin.transport.get_route(topic)
        addrs = {b.broker_name: b.broker_addrs for b in route.broker_datas}
        out: list[GroupQueues] = []
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            group_addrs = addrs.get(qd.broker_name)
            if qd.broker_name == exclude or not group_addrs:
                continue
            broker_id = min(group_addrs)  # 0, the master, when it is there
            try:
                endpoint = admin.runtime_info(group_addrs[broker_id]).get(GRPC_ENDPOINT_KEY, "")
            except BrokerSimError as exc:
                log.warning("broker group %s left out of the 5.x route of %s: %s", qd.broker_name, topic, exc)
                continue
            if not endpoint:
                log.info(
                    "broker group %s has no 5.x front end: not in the route of %s", qd.broker_name, topic
                )
                continue
            nums = (qd.read_queue_nums, qd.write_queue_nums)
            out.append(GroupQueues(qd.broker_name, broker_id, endpoint, *nums, qd.perm))
        return out

    def close(self) -> None:
        with self._lock:
            admin, self._admin = self._admin, None
        if admin is not None:
            admin.close()
