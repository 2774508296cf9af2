"""The RocketMQ requests that both ends of a client–broker conversation offer with the same signature.

Why one protocol: the client's transport (:class:`~broker_sim.common.transport.BrokerTransport`), the
Broker's request-level API (:class:`~broker_sim.common.broker_api.BrokerApi`) and the in-process transport
that joins the two each spelled out these methods; now both protocols extend this one, so a request's
signature and meaning are written once, and a change to it reaches both sides (mypy then checks every
implementation: the Broker, the in-process and the TCP transport). What stays in the two protocols is what
really differs — the client routes by ``broker_name`` and bounds sends with ``timeout_ms``, the broker
exposes its clock, store and lifecycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from broker_sim.common.channels import ClientChannel
from broker_sim.common.message import MessageExt, MessageQueue
from broker_sim.common.requests import (
    ConsumerSendMsgBackRequest,
    EndTransactionRequest,
    HeartbeatData,
    PullMessageRequest,
    PullMessageResponse,
    SubscriptionData,
)

PullCallback = Callable[[PullMessageResponse | BaseException], None]


class BrokerRequests(Protocol):
    """Requests with the same form on the client's and the broker's side (request code in brackets)."""

    def pull_message(self, request: PullMessageRequest, timeout_ms: int = 30_000) -> PullMessageResponse:
        """PULL_MESSAGE (11), blocking; with the SUSPEND bit the broker may hold it up to the suspend
        timeout."""
        ...

    def pull_message_async(self, request: PullMessageRequest, callback: PullCallback) -> None:
        """PULL_MESSAGE (11) without blocking the caller; ``callback`` gets the response or the error."""
        ...

    def heartbeat(self, data: HeartbeatData, channel: ClientChannel) -> None:
        """HEART_BEAT (34)."""
        ...

    def unregister_client(
        self, client_id: str, producer_group: str | None, consumer_group: str | None
    ) -> None:
        """UNREGISTER_CLIENT (35)."""
        ...

    def check_client_config(
        self, consumer_group: str, client_id: str, subscription: SubscriptionData
    ) -> None:
        """CHECK_CLIENT_CONFIG (46): BrokerResponseError if the broker cannot serve the subscription."""
        ...

    def consumer_send_msg_back(self, request: ConsumerSendMsgBackRequest) -> None:
        """CONSUMER_SEND_MSG_BACK (36)."""
        ...

    def end_transaction(self, request: EndTransactionRequest) -> None:
        """END_TRANSACTION (37, oneway)."""
        ...

    def lock_batch_mq(self, consumer_group: str, client_id: str, mqs: set[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ (41): the subset now locked by ``client_id``."""
        ...

    def unlock_batch_mq(self, consumer_group: str, client_id: str, mqs: set[MessageQueue]) -> None:
        """UNLOCK_BATCH_MQ (42)."""
        ...

    def view_message_by_id(self, offset_msg_id: str) -> MessageExt:
        """VIEW_MESSAGE_BY_ID (33), by the broker's offset message id."""
        ...
