"""Broker-side handlers of the operator requests ``mqadmin`` and the dashboard send (``AdminBrokerProcessor``
in 4.9.8), each a thin mapping onto one Broker method.

Bodies are Java's JSON shapes where they are plain JSON. Where Java keys a map by a ``MessageQueue`` object
(TopicStatsTable, ResetOffsetBody, ConsumerRunningInfo.mqTable) fastjson writes an object as the key, which
is not JSON; broker_sim sends a list of rows with the queue's fields instead, read by its own admin client.
"""

from __future__ import annotations

from typing import Any, Protocol

from broker_sim.common.admin_types import ConsumerConnection, QueueStats
from broker_sim.common.message import MessageQueue
from broker_sim.remoting import bodies
from broker_sim.remoting.codes import RequestCode, ResponseCode
from broker_sim.remoting.command import RemotingCommand
from broker_sim.remoting.header import Fields
from broker_sim.remoting.server import Connection, Handler


class OpsApi(Protocol):
    """The Broker methods these handlers call."""

    def runtime_info(self) -> dict[str, str]: ...

    def update_subscription_group(self, config: Any) -> None: ...

    def subscription_groups(self) -> list[Any]: ...

    def topic_stats(self, topic: str) -> list[QueueStats]: ...

    def topic_consumed_by(self, topic: str) -> list[str]: ...

    def consumer_connection(self, group: str) -> ConsumerConnection: ...

    def producer_connection(self, group: str) -> list[Any]: ...

    def delete_topic(self, topic: str) -> bool: ...

    def reset_offset_by_time(
        self, topic: str, group: str, timestamp_ms: int, force: bool = True
    ) -> dict[MessageQueue, int]: ...

    def consumer_running_info(self, group: str, client_id: str) -> dict[str, Any]: ...

    def consume_message_directly(self, group: str, client_id: str, offset_msg_id: str) -> dict[str, Any]: ...

    def query_consume_queue(
        self, topic: str, queue_id: int, index: int, count: int
    ) -> tuple[list[tuple[int, int, int, int]], int, int]: ...


def queue_row(mq: MessageQueue, **extra: Any) -> dict[str, Any]:
    return {"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, **extra}


class OpsHandlers:
    def __init__(self, broker: OpsApi) -> None:
        self.broker = broker

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.GET_BROKER_RUNTIME_INFO: self.runtime_info,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.update_subscription_group,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.all_subscription_groups,
            RequestCode.GET_TOPIC_STATS_INFO: self.topic_stats,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: self.consumer_connections,
            RequestCode.GET_PRODUCER_CONNECTION_LIST: self.producer_connections,
            RequestCode.DELETE_TOPIC_IN_BROKER: self.delete_topic,
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: self.reset_offset,
            RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: self.topic_consumed_by,
            RequestCode.GET_CONSUMER_RUNNING_INFO: self.consumer_running_info,
            RequestCode.CONSUME_MESSAGE_DIRECTLY: self.consume_message_directly,
            RequestCode.QUERY_CONSUME_QUEUE: self.query_consume_queue,
        }

    @staticmethod
    def _json(cmd: RemotingCommand, obj: Any) -> RemotingCommand:
        return cmd.reply(ResponseCode.SUCCESS, body=bodies.dump_json(obj))

    def runtime_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return self._json(cmd, {"table": self.broker.runtime_info()})

    def update_subscription_group(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        from broker_sim.broker.clients import SubscriptionGroupConfig

        obj = bodies.load_json(cmd.body, "SubscriptionGroupConfig")
        if not isinstance(obj, dict) or not obj.get("groupName"):
            return cmd.reply(
                ResponseCode.SYSTEM_ERROR, "the body must be a SubscriptionGroupConfig with groupName"
            )
        try:
            config = SubscriptionGroupConfig.from_json(obj)
        except (TypeError, ValueError) as exc:
            return cmd.reply(ResponseCode.SYSTEM_ERROR, f"bad SubscriptionGroupConfig: {exc}")
        self.broker.update_subscription_group(config)
        return cmd.reply(ResponseCode.SUCCESS)

    def all_subscription_groups(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        table = {sg.group_name: sg.to_json() for sg in self.broker.subscription_groups()}
        return self._json(cmd, {"subscriptionGroupTable": table, "dataVersion": {"counter": len(table)}})

    def topic_stats(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        rows = [
            queue_row(
                s.queue,
                minOffset=s.min_offset,
                maxOffset=s.max_offset,
                lastUpdateTimestamp=s.last_update_timestamp,
            )
            for s in self.broker.topic_stats(Fields(cmd.ext_fields).text("topic"))
        ]
        return self._json(cmd, {"offsetTable": rows})

    def consumer_connections(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        cc = self.broker.consumer_connection(Fields(cmd.ext_fields).text("consumerGroup"))
        connections = [
            {"clientId": c.client_id, "clientAddr": c.client_addr, "language": "PYTHON", "version": 398}
            for c in cc.connections
        ]
        subscriptions = {
            s.topic: {
                "topic": s.topic,
                "subString": s.sub_string,
                "subVersion": s.sub_version,
                "expressionType": str(s.expression_type),
            }
            for s in cc.subscriptions
        }
        return self._json(
            cmd,
            {
                "connectionSet": connections,
                "subscriptionTable": subscriptions,
                "consumeType": cc.consume_type.name,
                "messageModel": cc.message_model.name,
                "consumeFromWhere": cc.consume_from_where.name,
            },
        )

    def producer_connections(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        conns = self.broker.producer_connection(Fields(cmd.ext_fields).text("producerGroup"))
        rows = [{"clientId": c.client_id, "clientAddr": c.client_addr, "language": "PYTHON"} for c in conns]
        return self._json(cmd, {"connectionSet": rows})

    def delete_topic(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.broker.delete_topic(Fields(cmd.ext_fields).text("topic"))
        return cmd.reply(ResponseCode.SUCCESS)

    def reset_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        table = self.broker.reset_offset_by_time(
            f.text("topic"), f.text("group"), f.num("timestamp"), f.flag("isForce", True)
        )
        return self._json(cmd, {"offsetTable": [queue_row(mq, offset=o) for mq, o in sorted(table.items())]})

    def topic_consumed_by(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return self._json(
            cmd, {"groupList": self.broker.topic_consumed_by(Fields(cmd.ext_fields).text("topic"))}
        )

    def consumer_running_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        return self._json(cmd, self.broker.consumer_running_info(f.text("consumerGroup"), f.text("clientId")))

    def consume_message_directly(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        result = self.broker.consume_message_directly(
            f.text("consumerGroup"), f.text("clientId"), f.text("msgId")
        )
        return self._json(cmd, result)

    def query_consume_queue(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        units, lo, hi = self.broker.query_consume_queue(
            f.text("topic"), f.num("queueId", 0), f.num("index", 0), f.num("count", 10)
        )
        rows = [{"queueOffset": q, "physicOffset": p, "physicSize": s, "tagsCode": t} for q, p, s, t in units]
        return self._json(cmd, {"queueData": rows, "minQueueIndex": lo, "maxQueueIndex": hi})
