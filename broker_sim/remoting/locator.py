"""How a client finds brokers: the name servers it was given (``"a:9876;b:9876"``, used one at a time, the
next one after a connection failure — NettyRemotingClient rotates the same way), and through them each
broker group's master and slaves (:class:`~broker_sim.remoting.broker_directory.BrokerDirectory`).

Writes go to a group's master; reads (``read=True``: pulls, offsets) to its slave while no master is listed
(the name server asked again on each such read, so a master that is back is read at once),
and a pull to the node the group's last pull reply suggested (``suggestWhichBrokerId``, :meth:`pull_target`).
Without a group name (single-broker callers) the first group that serves the topic is used.

A request any broker of a topic can answer (the consumer list of a group, a client config check) goes to a
master of the topic chosen at random (:meth:`BrokerLocator.any_master_of`, as RocketMQ 4.9.8's
``MQClientInstance.findBrokerAddrByTopic``), and the caller falls back to the next one when it fails — the
Java client does not, so one hung master there fails every second rebalance until the name server drops it.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
from collections.abc import Callable, Mapping
from typing import ParamSpec, TypeVar

from broker_sim.common.errors import BrokerResponseError, TransportError, error_for_code
from broker_sim.common.message import SysFlag
from broker_sim.common.requests import PullMessageRequest, ResponseCode, TopicRouteData
from broker_sim.remoting import bodies
from broker_sim.remoting.broker_directory import BrokerDirectory
from broker_sim.remoting.codes import RequestCode
from broker_sim.remoting.errors import RemotingError
from broker_sim.remoting.frame import RemotingCommand

log = logging.getLogger("broker_sim.remoting.locator")

Invoke = Callable[[str, RemotingCommand], RemotingCommand]
Request = Callable[[int, Mapping[str, object] | None], RemotingCommand]


def ok(reply: RemotingCommand) -> RemotingCommand:
    if reply.code != ResponseCode.SUCCESS:
        raise error_for_code(reply.code, reply.remark or f"request failed with code {reply.code}")
    return reply


T = TypeVar("T")
P = ParamSpec("P")


def _decoded(parse: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """A reply that does not parse is a transport fault for the caller (the transport contract)."""
    try:
        return parse(*args, **kwargs)
    except RemotingError as exc:
        raise TransportError(f"undecodable reply: {exc}") from exc


class BrokerLocator:
    def __init__(self, namesrv_addr: str, invoke: Invoke, request: Request) -> None:
        self._namesrvs = [a for a in namesrv_addr.split(";") if a]
        self._namesrv_index = 0
        self._invoke = invoke
        self._request = request
        self._lock = threading.Lock()
        self.directory = BrokerDirectory()
        self._random = random.Random()
        #: topic -> the broker groups its last fetched route listed
        self._topic_groups: dict[str, list[str]] = {}

    def ask_namesrv(self, code: int, fields: Mapping[str, object] | None = None) -> RemotingCommand:
        """A name-server request to the current name server; on a connection failure the next one is
        tried (NettyRemotingClient.getAndCreateNameserverChannel rotates the same way)."""
        last: TransportError | None = None
        for _ in range(len(self._namesrvs)):
            with self._lock:
                addr = self._namesrvs[self._namesrv_index % len(self._namesrvs)]
            try:
                return self._invoke(addr, self._request(code, fields))
            except TransportError as exc:
                log.info("name server %s failed (%s); trying the next one", addr, exc)
                last = exc
                with self._lock:
                    if self._namesrvs[self._namesrv_index % len(self._namesrvs)] == addr:
                        self._namesrv_index += 1
        assert last is not None
        raise last

    def broker(self, broker_name: str | None = None, *, read: bool = False) -> str:
        """The master of ``broker_name`` (of any group for ``None``; with ``read``, its slave when the
        master is not listed), asking the name server when it is not known.

        A read that finds no master listed asks the name server again before it settles for a slave, every
        time (``RemoteBrokerOffsetStore``: ``findBrokerAddressInSubscribe(name, MASTER_ID, true)``, and on a
        miss ``updateTopicRouteInfoFromNameServer`` before the call that may pick a slave): a master that is
        back is read again at once. Without that, a client that sends and consumes nothing (the sweeper's
        probe) read the slave for good after a failover — a slave a power cut left ahead of its master stops
        copying, and its max offset made every message the master stored past it look lost. A master that
        failed a request lately is read after the slaves (:meth:`BrokerDirectory.reader`)."""
        if read and broker_name:
            return self._reader(broker_name)
        addr = self.directory.master(broker_name)
        if addr is None:
            self.refresh()
            addr = self.directory.master(broker_name)
        if addr is None:
            raise TransportError(f"no broker address known for {broker_name or 'any broker'}")
        return addr

    def _reader(self, broker_name: str) -> str:
        """Where a read of ``broker_name`` goes (:meth:`broker` with ``read``).

        The name server is asked again whenever the read would not go to the master — none listed, *or*
        one listed but failed lately: a power-cut master's connection closes on the name server a moment
        after ours fails, and a refresh in that moment lists it still. Until 2026-11-29 such a listing was
        kept (no refresh while a master was listed): the dropped master was never seen gone, so never seen
        back, and its slave was read for :data:`~broker_sim.remoting.broker_directory.SUSPECT_S` after the
        restart (its stale max offset: the sweeper's probe found the restarted master's messages lost)."""
        master = self.directory.master(broker_name)
        if master is None or self.directory.reader(broker_name) != master:
            try:
                self.refresh()
            except (TransportError, BrokerResponseError) as exc:
                # the name server cannot say (Java's route update logs it and goes on): read what is known
                if self.directory.reader(broker_name) is None:
                    raise
                log.info("name server not reachable (%s); reading %s from what is known", exc, broker_name)
        addr = self.directory.reader(broker_name)
        if addr is None:
            raise TransportError(f"no broker address known for {broker_name}")
        return addr

    def refresh(self) -> None:
        """Replace the directory with the name server's cluster info (GET_BROKER_CLUSTER_INFO)."""
        reply = ok(self.ask_namesrv(RequestCode.GET_BROKER_CLUSTER_INFO))
        info = _decoded(bodies.load_json, reply.body, "cluster info")
        table = info.get("brokerAddrTable", {}) if isinstance(info, dict) else {}
        groups: dict[str, dict[int, str]] = {}
        for name, data in table.items():
            addrs = data.get("brokerAddrs", {}) if isinstance(data, dict) else {}
            groups[str(name)] = {int(i): str(a) for i, a in addrs.items()}
        self.directory.replace(groups)

    def broker_of(self, broker_name: str, topic: str, *, read: bool = False) -> str:
        """Where a request about a queue of ``broker_name`` goes (its master; with ``read``, its slave while
        the master is down); without a name, a broker of ``topic`` (single-broker callers)."""
        return self.broker(broker_name, read=read) if broker_name else self.broker_for_topic(topic)

    def reader_of(self, broker_name: str, broker_id: int) -> tuple[str, bool]:
        """Where a pull of a queue of ``broker_name`` goes when the last reply suggested node
        ``broker_id`` (:meth:`BrokerDirectory.in_subscribe`), asking the name server when the group is not
        known; returns the address and whether it is a slave."""
        found = self.directory.in_subscribe(broker_name, broker_id)
        if found is None:
            self.refresh()
            found = self.directory.in_subscribe(broker_name, broker_id)
        if found is None:
            raise TransportError(f"no broker address known for {broker_name}")
        return found

    def pull_target(self, request: PullMessageRequest) -> tuple[str, PullMessageRequest]:
        """The address a pull goes to — node ``request.broker_id`` of its group, as the last reply
        suggested (``PullAPIWrapper.pullKernelImpl``) — and the request to send there: a slave gets no
        commit offset (``PullSysFlag.clearCommitOffsetFlag``; offsets are committed to the master)."""
        if not request.broker_name:
            return self.broker_for_topic(request.topic), request
        addr, slave = self.reader_of(request.broker_name, request.broker_id)
        if slave and request.sys_flag & SysFlag.PULL_COMMIT_OFFSET:
            request = dataclasses.replace(request, sys_flag=request.sys_flag & ~SysFlag.PULL_COMMIT_OFFSET)
        return addr, request

    def masters(self) -> list[str]:
        """Every group's master address (heartbeats and client unregistration go to all, as Java's
        ``sendHeartbeatToAllBroker``)."""
        self.refresh()
        masters = self.directory.masters()
        if not masters:
            raise TransportError("no broker registered with the name server")
        return masters

    def broker_for_topic(self, topic: str) -> str:
        if self.directory.empty():
            try:
                self.get_route(topic)
            except RemotingError:
                log.debug("route lookup for %s failed", topic, exc_info=True)
        return self.broker()

    def any_master_of(self, topic: str) -> list[str]:
        """The masters of the broker groups serving ``topic``, in random order (``findBrokerAddrByTopic``
        picks one at random), the ones that failed a request lately last
        (:meth:`BrokerDirectory.healthy_first`): the first is where a request any of them can answer goes,
        the rest are the fallbacks. Every master when the topic's route is not known."""
        with self._lock:
            names = list(self._topic_groups.get(topic, ()))
        if not names:
            try:
                names = [b.broker_name for b in self.get_route(topic).broker_datas]
            except (TransportError, BrokerResponseError) as exc:
                log.debug("route of %s unknown (%s); asking any master", topic, exc)
        addrs = [a for a in map(self.directory.master, names) if a is not None]
        if not addrs:
            addrs = self.masters()
        self._random.shuffle(addrs)
        return self.directory.healthy_first(addrs)

    def get_route(self, topic: str) -> TopicRouteData:
        reply = ok(self.ask_namesrv(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))
        route = _decoded(bodies.parse_route, reply.body)
        for b in route.broker_datas:
            self.directory.update(b.broker_name, b.broker_addrs)
        with self._lock:
            self._topic_groups[topic] = [b.broker_name for b in route.broker_datas]
        return route
