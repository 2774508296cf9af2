"""A topic's 5.x route and push-consumer assignments across every broker group of the cluster.

A 5.x client takes the whole route of a topic from whichever endpoint it asks: QueryRoute lists the message
queues of every broker group, each with the endpoints to reach that group, and a push consumer's
QueryAssignment (asked at the endpoint of a random queue of that route) names every group it is to receive
from. This front end's own broker answers from its topic table, at the endpoint the client used; the other
groups come from the name servers through :class:`~.peers.PeerGroups`, at their own front ends.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING, Any

from broker_sim.broker.errors import TopicNotExistError
from broker_sim.common.requests import Perm
from broker_sim.errors import BrokerSimError
from broker_sim.grpc.peers import GroupQueues, PeerGroups
from broker_sim.grpc.protocol import Protocol

if TYPE_CHECKING:
    from broker_sim.broker.broker import Broker

log = logging.getLogger("broker_sim.grpc.route")


def cluster_queues(broker: Broker, peers: PeerGroups | None, topic: str) -> list[GroupQueues]:
    """The groups holding ``topic``: this broker's first (when it has the topic), then the others in broker
    name order; raises ``TopicNotExistError`` when no group has it."""
    own_name = broker.config.broker_name
    out: list[GroupQueues] = []
    tc = broker.topics.select(topic)
    if tc is not None:
        nums = (tc.read_queue_nums, tc.write_queue_nums)
        out.append(GroupQueues(own_name, broker.config.broker_id, "", *nums, tc.perm))
    if peers is not None:
        try:
            out.extend(peers.queues(topic, own_name))
        except TopicNotExistError:
            log.debug("no name server routes %s: this broker's queues only", topic)
        except BrokerSimError as exc:  # the name servers could not be asked: what this broker has
            log.warning("route of %s from the name servers failed: %s; this broker's queues only", topic, exc)
    if not out:
        raise TopicNotExistError(f"topic {topic} does not exist")
    return out


def _set_endpoints(pb: Protocol, target: Any, endpoint: str) -> None:
    host, _, port = endpoint.rpartition(":")
    try:
        ip = ipaddress.ip_address(host)
        target.scheme = pb.definition.IPv4 if ip.version == 4 else pb.definition.IPv6
    except ValueError:
        target.scheme = pb.definition.DOMAIN_NAME
    target.addresses.add(host=host, port=int(port))


def _fill(pb: Protocol, mq: Any, request: Any, group: GroupQueues, queue_id: int, permission: int) -> None:
    d = pb.definition
    mq.topic.CopyFrom(request.topic)
    mq.id = queue_id
    mq.permission = permission
    mq.broker.name = group.broker_name
    mq.broker.id = group.broker_id
    if group.endpoint:
        _set_endpoints(pb, mq.broker.endpoints, group.endpoint)
    else:
        mq.broker.endpoints.CopyFrom(request.endpoints)
    mq.accept_message_types.extend([d.NORMAL, d.FIFO, d.DELAY, d.TRANSACTION])


def _permission(pb: Protocol, readable: bool, writable: bool) -> int:
    d = pb.definition
    if readable and writable:
        return int(d.READ_WRITE)
    return int(d.READ if readable else d.WRITE if writable else d.NONE)


def add_route(pb: Protocol, response: Any, request: Any, groups: list[GroupQueues]) -> None:
    """Every queue of every group into a QueryRouteResponse; a slave's queues are not writable."""
    for g in groups:
        readable, writable = bool(g.perm & Perm.READ), bool(g.perm & Perm.WRITE) and g.broker_id == 0
        for queue_id in range(max(g.read_queue_nums, g.write_queue_nums)):
            permission = _permission(pb, readable and queue_id < g.read_queue_nums,
                                     writable and queue_id < g.write_queue_nums)  # fmt: skip
            _fill(pb, response.message_queues.add(), request, g, queue_id, permission)


def add_assignments(pb: Protocol, response: Any, request: Any, groups: list[GroupQueues]) -> None:
    """One assignment per readable group into a QueryAssignmentResponse: queue ``-1``, all of its queues
    (pop consumers share every queue)."""
    for g in groups:
        if g.perm & Perm.READ and g.read_queue_nums > 0:
            _fill(pb, response.assignments.add().message_queue, request, g, -1, int(pb.definition.READ_WRITE))
