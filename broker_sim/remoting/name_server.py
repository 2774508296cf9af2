"""The name server: topic routes for clients, built from the co-located broker's topic table.

``broker-sim serve`` runs one broker, so there is no broker registration protocol: the name server asks the
broker (through :class:`TopicTable`) what it has, and every route names that broker as master (id 0).

Routes returned beyond the plain topic table, because the real client depends on them:

- ``%RETRY%<group>`` always has a route (G11): clustering push consumers subscribe to it before anything was
  ever sent back, and a missing route makes the C++ client log errors and retry forever.
- ``TBW102`` has a route only when topic auto-creation is on; a producer asks for it when its own topic is
  unknown, and sends with ``defaultTopic=TBW102`` so the broker creates the topic.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from broker_sim.remoting.codes import RequestCode, ResponseCode
from broker_sim.remoting.frame import RemotingCommand
from broker_sim.remoting.header import Fields
from broker_sim.remoting.server import Connection, Handler

log = logging.getLogger("broker_sim.remoting.name_server")

RETRY_PREFIX = "%RETRY%"
DEFAULT_TOPIC = "TBW102"
PERM_READ_WRITE = 6
REGISTER_PERIOD_S = 30.0  # BrokerConfig.registerNameServerPeriod


@dataclass(frozen=True)
class QueueData:
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE
    topic_sys_flag: int = 0


class TopicTable(Protocol):
    """What the name server needs from the broker."""

    def queue_data(self, topic: str) -> QueueData | None: ...

    def topic_names(self) -> list[str]: ...


class BrokerTopics:
    """:class:`TopicTable` over a :class:`broker_sim.broker.Broker` (typed loosely: only two calls used)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def queue_data(self, topic: str) -> QueueData | None:
        from broker_sim.common.errors import TopicNotExistError

        try:
            route = self.broker.get_route_info_by_topic(topic)
        except TopicNotExistError:
            return None
        if not route.queue_datas:
            return None
        q = route.queue_datas[0]
        return QueueData(q.read_queue_nums, q.write_queue_nums, q.perm, q.topic_sys_flag)

    def topic_names(self) -> list[str]:
        return [str(tc.topic_name) for tc in self.broker.topic_list()]


class NameServer:
    def __init__(
        self,
        topics: TopicTable,
        broker_addr: str,
        *,
        broker_name: str = "broker-a",
        cluster: str = "DefaultCluster",
        auto_create_topics: bool = False,
        default_queue_nums: int = 8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topics = topics
        self.broker_addr = broker_addr
        self.broker_name = broker_name
        self.cluster = cluster
        self.auto_create_topics = auto_create_topics
        self.default_queue_nums = default_queue_nums
        self.kv_config: dict[tuple[str, str], str] = {}  # (namespace, key) -> value, as KVConfigManager
        self.clock = clock
        self._deleted: dict[str, float] = {}  # topic -> when DELETE_TOPIC_IN_NAMESRV hid its route

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topics,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_cluster_info,
            RequestCode.PUT_KV_CONFIG: self.put_kv_config,
            RequestCode.GET_KV_CONFIG: self.get_kv_config,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self.delete_topic,
            RequestCode.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
        }

    def _hidden(self, topic: str) -> bool:
        """Deleted here but not (yet) re-registered: Java's broker re-registers every 30 s, which brings a
        route back if the broker still has the topic; broker_sim hides it for that long."""
        since = self._deleted.get(topic)
        if since is None:
            return False
        if self.clock() - since < REGISTER_PERIOD_S:
            return True
        del self._deleted[topic]
        return False

    def route(self, topic: str) -> dict[str, Any] | None:
        """TopicRouteData for ``topic`` as the JSON object the client parses (§D), or None if unknown."""
        if self._hidden(topic):
            return None
        qd = self.topics.queue_data(topic)
        if qd is None and topic.startswith(RETRY_PREFIX):
            qd = QueueData(1, 1)
        if qd is None and topic == DEFAULT_TOPIC and self.auto_create_topics:
            qd = QueueData(self.default_queue_nums, self.default_queue_nums, perm=7)
        if qd is None:
            return None
        return {
            "orderTopicConf": None,
            "queueDatas": [
                {
                    "brokerName": self.broker_name,
                    "readQueueNums": qd.read_queue_nums,
                    "writeQueueNums": qd.write_queue_nums,
                    "perm": qd.perm,
                    "topicSysFlag": qd.topic_sys_flag,
                }
            ],
            "brokerDatas": [
                {
                    "cluster": self.cluster,
                    "brokerName": self.broker_name,
                    "brokerAddrs": {"0": self.broker_addr},
                }
            ],
            "filterServerTable": {},
        }

    def get_route_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = Fields(cmd.ext_fields).text("topic")
        route = self.route(topic)
        if route is None:
            return cmd.reply(
                ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}"
            )
        return cmd.reply(ResponseCode.SUCCESS, body=json.dumps(route).encode())

    def _topic_names(self) -> list[str]:
        return sorted(t for t in self.topics.topic_names() if not self._hidden(t))

    def get_all_topics(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        body = json.dumps({"topicList": self._topic_names()}).encode()
        return cmd.reply(ResponseCode.SUCCESS, body=body)

    def get_topics_by_cluster(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_TOPICS_BY_CLUSTER (224): the topics of the cluster's brokers (none for another cluster)."""
        cluster = Fields(cmd.ext_fields).text("cluster")
        topics = self._topic_names() if cluster == self.cluster else []
        return cmd.reply(ResponseCode.SUCCESS, body=json.dumps({"topicList": topics}).encode())

    def delete_topic(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """DELETE_TOPIC_IN_NAMESRV (216): forget the topic's route (``mqadmin deleteTopic`` sends it after
        DELETE_TOPIC_IN_BROKER to every broker)."""
        self._deleted[Fields(cmd.ext_fields).text("topic")] = self.clock()
        return cmd.reply(ResponseCode.SUCCESS)

    def put_kv_config(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """PUT_KV_CONFIG (100); kept in memory (Java also writes kvConfig.json)."""
        f = Fields(cmd.ext_fields)
        self.kv_config[(f.text("namespace"), f.text("key"))] = f.text("value")
        return cmd.reply(ResponseCode.SUCCESS)

    def get_kv_config(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_KV_CONFIG (101): ``value``, or QUERY_NOT_FOUND (22) as ``DefaultRequestProcessor`` answers."""
        f = Fields(cmd.ext_fields)
        namespace, key = f.text("namespace"), f.text("key")
        value = self.kv_config.get((namespace, key))
        if value is None:
            return cmd.reply(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace} Key: {key}"
            )
        return cmd.reply(ResponseCode.SUCCESS, ext_fields={"value": value})

    def get_cluster_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """ClusterInfo: how a client that has no topic yet (an admin tool, a heartbeat) finds the brokers."""
        broker = {
            "cluster": self.cluster,
            "brokerName": self.broker_name,
            "brokerAddrs": {"0": self.broker_addr},
        }
        body = json.dumps(
            {
                "brokerAddrTable": {self.broker_name: broker},
                "clusterAddrTable": {self.cluster: [self.broker_name]},
            }
        ).encode()
        return cmd.reply(ResponseCode.SUCCESS, body=body)
