"""The Broker's request-level API as a protocol (what :class:`broker_sim.broker.Broker` offers every front
end), so transports and servers can be typed without importing the broker."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from broker_sim.clock import Clock
from broker_sim.common.message import MessageExt, MessageQueue
from broker_sim.common.requests import (
    BatchEntry,
    ClientChannel,
    ConsumerSendMsgBackRequest,
    EndTransactionRequest,
    HeartbeatData,
    PullMessageRequest,
    PullMessageResponse,
    SendMessageRequest,
    SendMessageResponse,
    SubscriptionData,
    TopicRouteData,
)
from broker_sim.common.transport import PullCallback


class BrokerApi(Protocol):
    """The Broker's request-level API: one method per RocketMQ request, as the network front ends (remoting,
    gRPC) and the in-process transport call it. Structural, so they depend on this contract, not on how a
    Broker is built."""

    @property
    def clock(self) -> Clock: ...

    @property
    def store_dir(self) -> Path: ...

    @property
    def running(self) -> bool: ...

    def pull_message(self, request: PullMessageRequest, timeout_ms: int = 30_000) -> PullMessageResponse: ...

    def get_route_info_by_topic(self, topic: str) -> TopicRouteData: ...

    def send_message(self, request: SendMessageRequest, body: bytes) -> SendMessageResponse: ...

    def send_batch_message(
        self, request: SendMessageRequest, entries: Sequence[BatchEntry]
    ) -> SendMessageResponse: ...

    def pull_message_async(self, request: PullMessageRequest, callback: PullCallback) -> None: ...

    def heartbeat(self, data: HeartbeatData, channel: ClientChannel) -> None: ...

    def unregister_client(
        self, client_id: str, producer_group: str | None, consumer_group: str | None
    ) -> None: ...

    def get_consumer_list_by_group(self, consumer_group: str) -> list[str]: ...

    def check_client_config(self, group: str, client_id: str, subscription: SubscriptionData) -> None: ...

    def query_consumer_offset(self, consumer_group: str, topic: str, queue_id: int) -> int | None: ...

    def update_consumer_offset(self, consumer_group: str, topic: str, queue_id: int, offset: int) -> None: ...

    def get_max_offset(self, topic: str, queue_id: int) -> int: ...

    def get_min_offset(self, topic: str, queue_id: int) -> int: ...

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int: ...

    def consumer_send_msg_back(self, request: ConsumerSendMsgBackRequest) -> None: ...

    def end_transaction(self, request: EndTransactionRequest) -> None: ...

    def lock_batch_mq(
        self, consumer_group: str, client_id: str, mqs: set[MessageQueue]
    ) -> set[MessageQueue]: ...

    def unlock_batch_mq(self, consumer_group: str, client_id: str, mqs: set[MessageQueue]) -> None: ...

    def view_message_by_id(self, offset_msg_id: str) -> MessageExt: ...

    def get_earliest_msg_store_time(self, topic: str, queue_id: int) -> int: ...

    def client_channel_closed(self, client_id: str) -> None: ...
