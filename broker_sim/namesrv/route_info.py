"""The name server's registry: which broker groups exist, who is alive in them, which topics they serve.

Modelled on RocketMQ 4.9.8's ``RouteInfoManager``. A name server holds nothing durable and talks to no other
name server: every broker registers with every name server (REGISTER_BROKER, every 30 s), so several name
servers converge on the same view independently, and a client may ask any of them.

Tables (one lock guards them all, as Java's read/write lock does):

- ``clusters``: cluster name -> broker names (``clusterAddrTable``)
- ``groups``: broker name -> {broker id -> address} (``brokerAddrTable``; id 0 is the master)
- ``topics``: topic -> {broker name -> queue data} (``topicQueueTable``); only a *master*'s registration
  writes queue data, and only when its topic-config data version changed or it registers for the first time
- ``live``: broker address -> last registration time, data version, connection, HA address
  (``brokerLiveTable``)

A broker leaves the tables when it unregisters (UNREGISTER_BROKER), when its connection closes
(``onChannelDestroy``) or when its last registration is older than :data:`BROKER_EXPIRED_MS`
(``scanNotActiveBroker``). When the last address of a group goes, the group's queue data goes with it; a
group whose master is gone but whose slave lives keeps its queues, so consumers can read from the slave.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker_sim.clock import Clock, SystemClock

#: RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME: a registration older than this is dropped
BROKER_EXPIRED_MS = 120_000
#: MixAll.MASTER_ID
MASTER_ID = 0
RETRY_PREFIX = "%RETRY%"
PERM_READ_WRITE = 6


@dataclass(frozen=True)
class TopicQueues:
    """One topic's QueueData for one broker group, as a master registered it."""

    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE
    topic_sys_flag: int = 0

    @classmethod
    def from_topic_config(cls, tc: Mapping[str, Any]) -> TopicQueues:
        return cls(
            int(tc.get("readQueueNums", 4)),
            int(tc.get("writeQueueNums", 4)),
            int(tc.get("perm", PERM_READ_WRITE)),
            int(tc.get("topicSysFlag", 0)),
        )


@dataclass(frozen=True)
class Registration:
    """One REGISTER_BROKER request, decoded (RegisterBrokerRequestHeader + RegisterBrokerBody)."""

    cluster: str
    broker_addr: str
    broker_name: str
    broker_id: int
    ha_server_addr: str
    topic_configs: Mapping[str, Mapping[str, Any]]
    data_version: Mapping[str, Any]


@dataclass(frozen=True)
class RegisterResult:
    """RegisterBrokerResponseHeader: a slave learns its master's address and HA address here."""

    master_addr: str = ""
    ha_server_addr: str = ""


@dataclass
class _Live:
    last_update_ms: int
    data_version: Mapping[str, Any]
    channel: Hashable | None
    ha_server_addr: str


@dataclass
class _Group:
    cluster: str
    addrs: dict[int, str] = field(default_factory=dict)


class RouteInfoManager:
    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self._lock = threading.RLock()
        self.clusters: dict[str, set[str]] = {}
        self.groups: dict[str, _Group] = {}
        self.topics: dict[str, dict[str, TopicQueues]] = {}
        self.live: dict[str, _Live] = {}

    # -- registration --

    def register(self, reg: Registration, channel: Hashable | None = None) -> RegisterResult:
        with self._lock:
            self.clusters.setdefault(reg.cluster, set()).add(reg.broker_name)
            group = self.groups.get(reg.broker_name)
            first = group is None
            if group is None:
                group = self.groups[reg.broker_name] = _Group(reg.cluster)
            # a slave promoted to master (or the reverse): one address has one id
            for bid in [i for i, a in group.addrs.items() if a == reg.broker_addr and i != reg.broker_id]:
                del group.addrs[bid]
            first = first or group.addrs.get(reg.broker_id) is None
            group.addrs[reg.broker_id] = reg.broker_addr
            if reg.broker_id == MASTER_ID:
                prev = self.live.get(reg.broker_addr)
                if first or prev is None or prev.data_version != reg.data_version:
                    for name, tc in reg.topic_configs.items():
                        self.topics.setdefault(name, {})[reg.broker_name] = TopicQueues.from_topic_config(tc)
            self.live[reg.broker_addr] = _Live(
                self.clock.now_ms(), dict(reg.data_version), channel, reg.ha_server_addr
            )
            if reg.broker_id != MASTER_ID:
                master = group.addrs.get(MASTER_ID)
                master_live = self.live.get(master) if master else None
                if master and master_live is not None:
                    return RegisterResult(master, master_live.ha_server_addr)
            return RegisterResult()

    def unregister(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> None:
        with self._lock:
            self.live.pop(broker_addr, None)
            group = self.groups.get(broker_name)
            if group is not None and group.addrs.get(broker_id) == broker_addr:
                del group.addrs[broker_id]
            self._drop_empty_group(broker_name)

    def _remove_addr(self, broker_addr: str) -> None:
        self.live.pop(broker_addr, None)
        for name, group in list(self.groups.items()):
            for bid in [i for i, a in group.addrs.items() if a == broker_addr]:
                del group.addrs[bid]
            self._drop_empty_group(name)

    def _drop_empty_group(self, broker_name: str) -> None:
        group = self.groups.get(broker_name)
        if group is None or group.addrs:
            return
        del self.groups[broker_name]
        names = self.clusters.get(group.cluster)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self.clusters[group.cluster]
        for topic in list(self.topics):
            self.topics[topic].pop(broker_name, None)
            if not self.topics[topic]:
                del self.topics[topic]

    def channel_closed(self, channel: Hashable) -> list[str]:
        """onChannelDestroy: forget every broker that registered over ``channel``; returns their addresses."""
        with self._lock:
            gone = [addr for addr, live in self.live.items() if live.channel == channel]
            for addr in gone:
                self._remove_addr(addr)
            return gone

    def scan_not_active(self) -> list[str]:
        """scanNotActiveBroker: drop brokers whose last registration is older than 120 s."""
        with self._lock:
            now = self.clock.now_ms()
            gone = [a for a, live in self.live.items() if now - live.last_update_ms > BROKER_EXPIRED_MS]
            for addr in gone:
                self._remove_addr(addr)
            return gone

    def delete_topic(self, topic: str) -> None:
        """DELETE_TOPIC_IN_NAMESRV: forget the topic until a master registers it with a new data version."""
        with self._lock:
            self.topics.pop(topic, None)

    # -- queries --

    def route(self, topic: str) -> dict[str, Any] | None:
        """TopicRouteData (``pickupTopicRouteData``) as the JSON object clients parse, or None.

        ``%RETRY%<group>`` gets a one-queue route on every group with a master even before any broker
        created it (G11: a clustering push consumer subscribes to it before anything was sent back).
        """
        with self._lock:
            queues = dict(self.topics.get(topic, {}))
            if not queues and topic.startswith(RETRY_PREFIX):
                queues = {n: TopicQueues(1, 1) for n, g in self.groups.items() if MASTER_ID in g.addrs}
            names = sorted(n for n in queues if n in self.groups)
            if not names:
                return None
            return {
                "orderTopicConf": None,
                "queueDatas": [
                    {
                        "brokerName": n,
                        "readQueueNums": queues[n].read_queue_nums,
                        "writeQueueNums": queues[n].write_queue_nums,
                        "perm": queues[n].perm,
                        "topicSysFlag": queues[n].topic_sys_flag,
                    }
                    for n in names
                ],
                "brokerDatas": [self._broker_data(n) for n in names],
                "filterServerTable": {},
            }

    def _broker_data(self, name: str) -> dict[str, Any]:
        group = self.groups[name]
        addrs = {str(i): a for i, a in sorted(group.addrs.items())}
        return {"cluster": group.cluster, "brokerName": name, "brokerAddrs": addrs}

    def cluster_info(self) -> dict[str, Any]:
        """ClusterInfo (GET_BROKER_CLUSTER_INFO): every group with its addresses, every cluster's groups."""
        with self._lock:
            return {
                "brokerAddrTable": {n: self._broker_data(n) for n in sorted(self.groups)},
                "clusterAddrTable": {c: sorted(ns) for c, ns in sorted(self.clusters.items())},
            }

    def topic_names(self, cluster: str | None = None) -> list[str]:
        """All topics, or those served by a group of ``cluster`` (GET_TOPICS_BY_CLUSTER)."""
        with self._lock:
            if cluster is None:
                return sorted(self.topics)
            names = self.clusters.get(cluster, set())
            return sorted(t for t, q in self.topics.items() if names & q.keys())
