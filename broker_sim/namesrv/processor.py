"""The name server's request handlers (RocketMQ 4.9.8 ``DefaultRequestProcessor``) over a
:class:`~broker_sim.namesrv.route_info.RouteInfoManager`, and the scan that expires silent brokers.

Everything a client or admin tool asks is answered from what brokers registered: routes
(GET_ROUTEINFO_BY_TOPIC 105), ClusterInfo (GET_BROKER_CLUSTER_INFO 106), topic lists (206, 224). The KV
config (100/101) is kept in memory only (Java also writes ``kvConfig.json``).
"""

from __future__ import annotations

import json
import logging
import threading
import zlib
from typing import Any

from broker_sim.namesrv.route_info import Registration, RouteInfoManager
from broker_sim.remoting.codes import RequestCode, ResponseCode
from broker_sim.remoting.frame import RemotingCommand
from broker_sim.remoting.header import Fields
from broker_sim.remoting.server import Connection, Handler

log = logging.getLogger("broker_sim.namesrv")

#: NamesrvController: scanNotActiveBroker runs every 10 s (first after 5 s)
SCAN_PERIOD_S = 10.0


def body_crc32(body: bytes) -> int:
    """UtilAll.crc32: CRC-32 masked to a non-negative Java int (0 means "not checked")."""
    return zlib.crc32(body) & 0x7FFFFFFF


class NameServerProcessor:
    def __init__(self, routes: RouteInfoManager | None = None) -> None:
        self.routes = routes or RouteInfoManager()
        self.kv_config: dict[tuple[str, str], str] = {}  # (namespace, key) -> value, as KVConfigManager
        self._stop = threading.Event()

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topics,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_cluster_info,
            RequestCode.PUT_KV_CONFIG: self.put_kv_config,
            RequestCode.GET_KV_CONFIG: self.get_kv_config,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self.delete_topic,
            RequestCode.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
        }

    # -- broker lifecycle --

    def handle(self, cmd: RemotingCommand) -> RemotingCommand:
        """A registration from a broker in this process (no connection: it leaves only by unregistering
        or expiring)."""
        handler = {
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
        }[RequestCode(cmd.code)]
        return handler(cmd, None)

    def register_broker(self, cmd: RemotingCommand, conn: Connection | None) -> RemotingCommand:
        """REGISTER_BROKER (103): header RegisterBrokerRequestHeader, body RegisterBrokerBody JSON
        (``topicConfigSerializeWrapper`` {``topicConfigTable``, ``dataVersion``}, ``filterServerList``)."""
        f = Fields(cmd.ext_fields)
        crc = f.num("bodyCrc32", 0)
        if crc != 0 and body_crc32(cmd.body) != crc:
            return cmd.reply(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        if f.flag("compressed"):
            return cmd.reply(ResponseCode.SYSTEM_ERROR, "compressed registration bodies are not supported")
        wrapper: dict[str, Any] = {}
        if cmd.body:
            try:
                wrapper = json.loads(cmd.body).get("topicConfigSerializeWrapper") or {}
            except (ValueError, AttributeError) as exc:
                return cmd.reply(ResponseCode.SYSTEM_ERROR, f"Failed to decode RegisterBrokerBody: {exc}")
        reg = Registration(
            cluster=f.text("clusterName"),
            broker_addr=f.text("brokerAddr"),
            broker_name=f.text("brokerName"),
            broker_id=f.num("brokerId"),
            ha_server_addr=f.text("haServerAddr", ""),
            topic_configs=wrapper.get("topicConfigTable") or {},
            data_version=wrapper.get("dataVersion") or {"counter": 0, "timestamp": 0},
        )
        result = self.routes.register(reg, conn)
        fields = {"masterAddr": result.master_addr, "haServerAddr": result.ha_server_addr}
        return cmd.reply(ResponseCode.SUCCESS, ext_fields={k: v for k, v in fields.items() if v})

    def unregister_broker(self, cmd: RemotingCommand, conn: Connection | None) -> RemotingCommand:
        """UNREGISTER_BROKER (104): a broker shutting down cleanly leaves at once."""
        f = Fields(cmd.ext_fields)
        self.routes.unregister(
            f.text("clusterName"), f.text("brokerAddr"), f.text("brokerName"), f.num("brokerId")
        )
        return cmd.reply(ResponseCode.SUCCESS)

    def connection_closed(self, conn: Connection) -> None:
        """onChannelDestroy: a broker whose registration connection closed is gone."""
        for addr in self.routes.channel_closed(conn):
            log.info("broker %s removed: its connection closed", addr)

    def start_scan(self, period_s: float = SCAN_PERIOD_S) -> None:
        def scan() -> None:
            while not self._stop.wait(period_s):
                for addr in self.routes.scan_not_active():
                    log.warning("broker %s removed: no registration for 120 s", addr)

        threading.Thread(target=scan, name="namesrv-scan", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    # -- client and admin queries --

    def get_route_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = Fields(cmd.ext_fields).text("topic")
        route = self.routes.route(topic)
        if route is None:
            return cmd.reply(
                ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}"
            )
        return cmd.reply(ResponseCode.SUCCESS, body=json.dumps(route).encode())

    def get_all_topics(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        body = json.dumps({"topicList": self.routes.topic_names()}).encode()
        return cmd.reply(ResponseCode.SUCCESS, body=body)

    def get_topics_by_cluster(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_TOPICS_BY_CLUSTER (224): topics served by any group of the cluster."""
        topics = self.routes.topic_names(Fields(cmd.ext_fields).text("cluster"))
        return cmd.reply(ResponseCode.SUCCESS, body=json.dumps({"topicList": topics}).encode())

    def get_cluster_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """ClusterInfo: how a client that has no topic yet (an admin tool, a heartbeat) finds the brokers."""
        return cmd.reply(ResponseCode.SUCCESS, body=json.dumps(self.routes.cluster_info()).encode())

    def delete_topic(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """DELETE_TOPIC_IN_NAMESRV (216): ``mqadmin deleteTopic`` sends it after DELETE_TOPIC_IN_BROKER."""
        self.routes.delete_topic(Fields(cmd.ext_fields).text("topic"))
        return cmd.reply(ResponseCode.SUCCESS)

    def put_kv_config(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """PUT_KV_CONFIG (100)."""
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
