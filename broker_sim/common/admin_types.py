"""Reply types of the operator requests (``mqadmin``): queue stats, client connections."""

from __future__ import annotations

from dataclasses import dataclass

from broker_sim.common.message import MessageQueue
from broker_sim.common.requests import ConsumeFromWhere, ConsumeType, MessageModel, SubscriptionData


@dataclass(frozen=True)
class QueueStats:
    """One row of GET_TOPIC_STATS_INFO: a queue's min and max offset and when it was last written."""

    queue: MessageQueue
    min_offset: int
    max_offset: int
    last_update_timestamp: int


@dataclass(frozen=True)
class ClientConnection:
    client_id: str
    client_addr: str


@dataclass(frozen=True)
class ConsumerConnection:
    """GET_CONSUMER_CONNECTION_LIST: the group's live clients and what it subscribes to."""

    connections: tuple[ClientConnection, ...]
    subscriptions: tuple[SubscriptionData, ...]
    consume_type: ConsumeType
    message_model: MessageModel
    consume_from_where: ConsumeFromWhere
