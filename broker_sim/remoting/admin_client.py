"""The admin side of the remoting protocol (what ``mqadmin`` sends), for ``broker-sim admin`` and tests:
every request goes over the wire (name server, then broker), so the commands work against any broker-sim
reachable on the network and exercise the same protocol clients use."""

from __future__ import annotations

import time
from typing import Any

from broker_sim.common.errors import error_for_code
from broker_sim.common.message import MessageExt, MessageQueue
from broker_sim.common.requests import QueueProgress, ResponseCode
from broker_sim.remoting import bodies
from broker_sim.remoting.admin_handlers import READ_QUEUE
from broker_sim.remoting.client_transport import RemotingTransport
from broker_sim.remoting.codes import RequestCode
from broker_sim.remoting.records import decode_records


class AdminClient:
    """Admin requests (topic create/list, consume stats, query by key) on top of a RemotingTransport."""

    def __init__(self, namesrv: str, request_timeout_ms: int = 5000) -> None:
        self.transport = RemotingTransport(namesrv, request_timeout_ms=request_timeout_ms)

    def close(self) -> None:
        self.transport.close()

    def _broker_call(self, code: int, fields: dict[str, Any], body: bytes = b"") -> Any:
        t = self.transport
        reply = t._invoke(t._broker(), t._req(code, fields, body))
        if reply.code != ResponseCode.SUCCESS:
            raise error_for_code(reply.code, reply.remark or f"request {code} failed with code {reply.code}")
        return reply

    def create_topic(self, name: str, queues: int, perm: int) -> None:
        fields = {
            "topic": name,
            "defaultTopic": "TBW102",
            "readQueueNums": queues,
            "writeQueueNums": queues,
            "perm": perm,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": False,
        }
        self._broker_call(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)

    def topic_list(self) -> list[str]:
        t = self.transport
        reply = t._ok(t._ask_namesrv(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
        return [str(x) for x in bodies.load_json(reply.body, "topic list").get("topicList", [])]

    def route(self, topic: str) -> dict[str, Any]:
        return bodies.route_to_json(self.transport.get_route(topic))

    def consumer_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        reply = self._broker_call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": group, "topic": topic})
        rows = bodies.load_json(reply.body, "consume stats").get("offsetTable", [])
        return [
            QueueProgress(
                queue=MessageQueue(r["topic"], r["brokerName"], int(r["queueId"])),
                broker_offset=int(r["brokerOffset"]),
                consumer_offset=int(r["consumerOffset"]),
                last_timestamp=int(r.get("lastTimestamp", 0)),
            )
            for r in rows
        ]

    def query_by_key(self, topic: str, key: str, max_num: int) -> list[MessageExt]:
        fields = {
            "topic": topic,
            "key": key,
            "maxNum": max_num,
            "beginTimestamp": 0,
            "endTimestamp": int(time.time() * 1000) + 60_000,
        }
        t = self.transport
        reply = t._invoke(t._broker(), t._req(RequestCode.QUERY_MESSAGE, fields))
        if reply.code == ResponseCode.QUERY_NOT_FOUND:
            return []
        t._ok(reply)
        return decode_records(reply.body) if reply.body else []

    def view(self, msg_id: str) -> MessageExt:
        return self.transport.view_message_by_id(msg_id)

    def read_queue(self, topic: str, queue_id: int, max_num: int) -> list[MessageExt]:
        """Messages of one queue from its start, ignoring permissions and consumer offsets (READ_QUEUE)."""
        fields = {"topic": topic, "queueId": queue_id, "offset": 0, "maxNum": max_num}
        reply = self._broker_call(READ_QUEUE, fields)
        return decode_records(reply.body) if reply.body else []

    # -- cluster, topics, groups (mqadmin clusterList, topicStatus, deleteTopic, updateSubGroup) --

    def _namesrv_call(self, code: int, fields: dict[str, Any] | None = None) -> Any:
        t = self.transport
        reply = t._ask_namesrv(code, fields or {})
        if reply.code != ResponseCode.SUCCESS:
            raise error_for_code(reply.code, reply.remark or f"request {code} failed with code {reply.code}")
        return reply

    def cluster_info(self) -> dict[str, Any]:
        reply = self._namesrv_call(RequestCode.GET_BROKER_CLUSTER_INFO)
        info = bodies.load_json(reply.body, "cluster info")
        return info if isinstance(info, dict) else {}

    def runtime_info(self, broker_addr: str) -> dict[str, str]:
        t = self.transport
        reply = t._invoke(broker_addr, t._req(RequestCode.GET_BROKER_RUNTIME_INFO))
        t._ok(reply)
        table = bodies.load_json(reply.body, "runtime info").get("table", {})
        return {str(k): str(v) for k, v in table.items()}

    def topic_stats(self, topic: str) -> list[dict[str, Any]]:
        reply = self._broker_call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic})
        rows = bodies.load_json(reply.body, "topic stats").get("offsetTable", [])
        return [dict(r) for r in rows]

    def delete_topic(self, topic: str) -> None:
        """As ``mqadmin deleteTopic``: delete on the broker, then on the name server."""
        self._broker_call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
        self._namesrv_call(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic})

    def update_subscription_group(self, config: dict[str, Any]) -> None:
        self._broker_call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, bodies.dump_json(config))

    def subscription_groups(self) -> dict[str, dict[str, Any]]:
        reply = self._broker_call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {})
        table = bodies.load_json(reply.body, "subscription groups").get("subscriptionGroupTable", {})
        return {str(k): dict(v) for k, v in table.items()}

    # -- consumers (resetOffsetByTime, consumerConnection, consumerStatus) --

    def reset_offset(self, topic: str, group: str, timestamp_ms: int, force: bool) -> list[dict[str, Any]]:
        fields = {"topic": topic, "group": group, "timestamp": timestamp_ms, "isForce": force}
        reply = self._broker_call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields)
        return [dict(r) for r in bodies.load_json(reply.body, "reset offset").get("offsetTable", [])]

    def reset_offline_offset(self, topic: str, group: str, timestamp_ms: int) -> list[dict[str, Any]]:
        """For a group with no live client: search each queue's offset by time and commit it directly (what
        ``mqadmin resetOffsetByTime`` falls back to when the broker answers CONSUMER_NOT_ONLINE)."""
        t = self.transport
        route = t.get_route(topic)
        rows = []
        for qd in route.queue_datas:
            for qid in range(qd.write_queue_nums):
                if timestamp_ms == -1:
                    offset = t.get_max_offset(topic, qid)
                else:
                    offset = t.search_offset_by_timestamp(topic, qid, timestamp_ms)
                t.update_consumer_offset(group, topic, qid, offset)
                rows.append({"topic": topic, "brokerName": qd.broker_name, "queueId": qid, "offset": offset})
        return rows

    def consumer_connection(self, group: str) -> dict[str, Any]:
        reply = self._broker_call(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group})
        obj = bodies.load_json(reply.body, "consumer connection")
        return obj if isinstance(obj, dict) else {}

    def running_info(self, group: str, client_id: str) -> dict[str, Any]:
        fields = {"consumerGroup": group, "clientId": client_id, "jstackEnable": False}
        reply = self._broker_call(RequestCode.GET_CONSUMER_RUNNING_INFO, fields)
        obj = bodies.load_json(reply.body, "running info")
        return obj if isinstance(obj, dict) else {}

    def consume_directly(self, group: str, client_id: str, msg_id: str) -> dict[str, Any]:
        fields = {"consumerGroup": group, "clientId": client_id, "msgId": msg_id}
        reply = self._broker_call(RequestCode.CONSUME_MESSAGE_DIRECTLY, fields)
        obj = bodies.load_json(reply.body, "consume result")
        return obj if isinstance(obj, dict) else {}
