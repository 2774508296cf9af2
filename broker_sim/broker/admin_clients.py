"""Admin requests about groups and connected clients (RocketMQ's ``AdminBrokerProcessor`` and
``Broker2Client``): runtime info, subscription groups, topic stats, who consumes a topic, consumer/producer
connections, offset reset by time, a consumer's running info, and consuming one message directly.

The last three reach the clients themselves through :class:`~broker_sim.common.requests.AdminChannel`
(broker_sim's own clients serve it in-process and over TCP).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from broker_sim.common.admin_types import ClientConnection, ConsumerConnection, QueueStats
from broker_sim.common.channels import AdminChannel
from broker_sim.common.errors import BrokerResponseError, TopicNotExistError
from broker_sim.common.message import MessageExt, MessageQueue
from broker_sim.common.requests import ResponseCode

if TYPE_CHECKING:
    from broker_sim.broker.clients import SubscriptionGroupConfig
    from broker_sim.broker.context import BrokerContext

VERSION_DESC = "V4_9_8"  # what broker_sim answers as brokerVersionDesc: the release it follows
#: runtime-info key naming the 5.x gRPC front end that serves this broker (a broker_sim key, absent without a
#: front end): another group's front end reads it to put this group's queues in a cluster-wide 5.x route
GRPC_ENDPOINT_KEY = "brokerSimGrpcEndpoint"


class ClientAdminService:
    """Owned by the Broker (``broker.client_admin``); reads its managers and store."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self.boot_ms = int(time.time() * 1000)
        #: "host:port" of the 5.x front end serving this broker, set by it while it serves ("" without one)
        self.grpc_endpoint = ""

    # -- broker and groups ----------------------------------------------------------------------------------

    def runtime_info(self) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO (28): a few of Java's keys, every value a string as in its KVTable."""
        b = self.broker
        b.check_running()
        store = b.store
        return {
            "brokerVersionDesc": VERSION_DESC,
            "brokerVersion": "398",
            "bootTimestamp": str(self.boot_ms),
            "runtime": f"[ {(int(time.time() * 1000) - self.boot_ms) // 1000} seconds ]",
            "commitLogMinOffset": str(store.min_phy_offset),
            "commitLogMaxOffset": str(store.max_phy_offset),
            "dispatchBehindBytes": str(store.dispatch_behind_bytes()),
            "brokerName": b.config.broker_name,
            "clusterName": b.config.cluster_name,
            "topicCount": str(len(b.topics.topics())),
            "consumerGroupCount": str(len(b.groups.groups())),
            "enablePropertyFilter": str(b.config.enable_property_filter).lower(),
            **({GRPC_ENDPOINT_KEY: self.grpc_endpoint} if self.grpc_endpoint else {}),
        }

    def update_subscription_group(self, config: SubscriptionGroupConfig) -> None:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200)."""
        self.broker.check_running()
        if not config.group_name:
            raise BrokerResponseError("the subscription group needs a groupName")
        if config.retry_queue_nums < 0 or config.retry_max_times < 0:
            raise BrokerResponseError("retryQueueNums and retryMaxTimes must be >= 0")
        self.broker.groups.update(config)

    def subscription_groups(self) -> list[SubscriptionGroupConfig]:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201)."""
        self.broker.check_running()
        return self.broker.groups.groups()

    def topic_stats(self, topic: str) -> list[QueueStats]:
        """GET_TOPIC_STATS_INFO (202): TOPIC_NOT_EXIST for an unknown topic."""
        b = self.broker
        b.check_running()
        tc = b.topics.select(topic)
        if tc is None:
            raise TopicNotExistError(f"topic[{topic}] not exist")
        b.store.wait_dispatched(1.0)
        out = []
        for qid in range(tc.write_queue_nums):
            lo = b.store.get_min_offset_in_queue(topic, qid)
            hi = b.store.get_max_offset_in_queue(topic, qid)
            last = b.store.get_message_store_timestamp(topic, qid, hi - 1) if hi > 0 else 0
            out.append(QueueStats(MessageQueue(topic, b.config.broker_name, qid), lo, hi, max(last, 0)))
        return out

    def topic_consumed_by(self, topic: str) -> list[str]:
        """QUERY_TOPIC_CONSUME_BY_WHO (300): groups with a committed offset on, or a subscription to, it."""
        b = self.broker
        b.check_running()
        groups = set(b.offsets.groups_of_topic(topic))
        for group in b.consumers.groups():
            info = b.consumers.group(group)
            if info is not None and topic in info.subscriptions:
                groups.add(group)
        return sorted(groups)

    # -- connections ----------------------------------------------------------------------------------------

    def consumer_connection(self, group: str) -> ConsumerConnection:
        """GET_CONSUMER_CONNECTION_LIST (203): CONSUMER_NOT_ONLINE (206) when no client of the group is."""
        self.broker.check_running()
        info = self.broker.consumers.group(group)
        if info is None or not info.clients:
            raise BrokerResponseError(
                f"the consumer group[{group}] not online", ResponseCode.CONSUMER_NOT_ONLINE
            )
        conns = tuple(
            ClientConnection(ci.client_id, ci.channel.remote_address) for ci in sorted(
                info.clients.values(), key=lambda c: c.client_id)
        )  # fmt: skip
        return ConsumerConnection(
            conns, tuple(info.subscriptions.values()), info.consume_type, info.message_model,
            info.consume_from_where,
        )  # fmt: skip

    def producer_connection(self, group: str) -> list[ClientConnection]:
        """GET_PRODUCER_CONNECTION_LIST (204): SYSTEM_ERROR when the group has no live producer."""
        self.broker.check_running()
        clients = self.broker.producers.clients(group)
        if not clients:
            raise BrokerResponseError(f"the producer group[{group}] not exist")
        return [ClientConnection(ci.client_id, ci.channel.remote_address) for ci in clients]

    # -- reaching the clients -------------------------------------------------------------------------------

    def reset_offset_by_time(
        self, topic: str, group: str, timestamp_ms: int, force: bool = True
    ) -> dict[MessageQueue, int]:
        """INVOKE_BROKER_TO_RESET_OFFSET (222), as ``Broker2Client.resetOffset``: per queue the first offset
        stored at or after ``timestamp_ms`` (-1: the max offset); without ``force`` only offsets that move
        back. Every live client of the group is sent RESET_CONSUMER_CLIENT_OFFSET (220) and commits them;
        SYSTEM_ERROR for a group with no committed offset, CONSUMER_NOT_ONLINE when no client is live."""
        b = self.broker
        b.check_running()
        tc = b.topics.select(topic)
        if tc is None:
            raise BrokerResponseError(
                f"[reset-offset] reset offset failed, no topic in this broker. topic={topic}"
            )
        b.store.wait_dispatched(1.0)
        table: dict[MessageQueue, int] = {}
        for qid in range(tc.write_queue_nums):
            committed = b.offsets.query_offset(group, topic, qid)
            if committed == -1:
                raise BrokerResponseError(f"THe consumer group <{group}> not exist")
            if timestamp_ms == -1:
                target = b.store.get_max_offset_in_queue(topic, qid)
            else:
                target = max(0, b.store.get_offset_in_queue_by_time(topic, qid, timestamp_ms))
            mq = MessageQueue(topic, b.config.broker_name, qid)
            table[mq] = target if force or target < committed else committed
        info = b.consumers.group(group)
        if info is None or not info.clients:
            raise BrokerResponseError(
                f"Consumer not online, so can not reset offset, Group: {group} Topic: {topic} "
                f"Timestamp: {timestamp_ms}",
                ResponseCode.CONSUMER_NOT_ONLINE,
            )
        for ci in list(info.clients.values()):
            channel = ci.channel
            if not isinstance(channel, AdminChannel):
                raise BrokerResponseError(f"the client {ci.client_id} does not support resetting offsets")
            channel.reset_offset(ci.client_id, topic, group, dict(table))
        return table

    def _admin_channel(self, group: str, client_id: str) -> AdminChannel:
        info = self.broker.consumers.group(group)
        ci = info.clients.get(client_id) if info is not None else None
        if ci is None:
            raise BrokerResponseError(
                f"The consumer <{client_id}> not online, group <{group}>", ResponseCode.CONSUMER_NOT_ONLINE
            )
        if not isinstance(ci.channel, AdminChannel):
            raise BrokerResponseError(f"the client {client_id} does not answer admin requests")
        return ci.channel

    def consumer_running_info(self, group: str, client_id: str) -> dict[str, Any]:
        """GET_CONSUMER_RUNNING_INFO (307), forwarded to the client (``ConsumerRunningInfo``)."""
        self.broker.check_running()
        return self._admin_channel(group, client_id).consumer_running_info(client_id, group)

    def consume_message_directly(self, group: str, client_id: str, offset_msg_id: str) -> dict[str, Any]:
        """CONSUME_MESSAGE_DIRECTLY (309): the client runs its listener on one stored message and reports
        the outcome (``ConsumeMessageDirectlyResult``); nothing is committed or sent back."""
        self.broker.check_running()
        message: MessageExt = self.broker.view_message_by_id(offset_msg_id)
        return self._admin_channel(group, client_id).consume_message_directly(client_id, group, message)
