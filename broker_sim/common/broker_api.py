"""The Broker's request-level API as a protocol (what :class:`broker_sim.broker.Broker` offers every front
end), so transports and servers can be typed without importing the broker."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from broker_sim.clock import Clock
from broker_sim.common.broker_requests import BrokerRequests
from broker_sim.common.requests import BatchEntry, SendMessageRequest, SendMessageResponse, TopicRouteData


class BrokerApi(BrokerRequests, Protocol):
    """The Broker's request-level API: one method per RocketMQ request, as the network front ends (remoting,
    gRPC) and the in-process transport call it — those of :class:`BrokerRequests`, and the ones below,
    whose broker form has no routing or timeout argument. Structural, so they depend on this contract, not
    on how a Broker is built."""

    @property
    def clock(self) -> Clock: ...

    @property
    def store_dir(self) -> Path: ...

    @property
    def running(self) -> bool: ...

    def get_route_info_by_topic(self, topic: str) -> TopicRouteData: ...

    def send_message(self, request: SendMessageRequest, body: bytes) -> SendMessageResponse: ...

    def send_batch_message(
        self, request: SendMessageRequest, entries: Sequence[BatchEntry]
    ) -> SendMessageResponse: ...

    def get_consumer_list_by_group(self, consumer_group: str) -> list[str]: ...

    def query_consumer_offset(self, consumer_group: str, topic: str, queue_id: int) -> int | None: ...

    def update_consumer_offset(self, consumer_group: str, topic: str, queue_id: int, offset: int) -> None: ...

    def get_max_offset(self, topic: str, queue_id: int) -> int: ...

    def get_min_offset(self, topic: str, queue_id: int) -> int: ...

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int: ...

    def get_earliest_msg_store_time(self, topic: str, queue_id: int) -> int: ...

    def client_channel_closed(self, client_id: str) -> None: ...
