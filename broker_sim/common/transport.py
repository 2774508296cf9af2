"""The client's only way to talk to a broker: a small protocol whose methods mirror RocketMQ requests.

Producers and consumers never touch a :class:`~broker_sim.broker.Broker` directly; they call a
:class:`BrokerTransport`. Two implementations exist:

* ``broker_sim.broker.in_process.InProcessTransport`` — calls the Broker's request-level methods in this
  process (a Broker hands it out through :class:`TransportFactory`);
* ``broker_sim.remoting.client_transport.RemotingTransport`` — the same methods over RocketMQ's TCP remoting
  protocol (name server route lookup, then the broker master), written by the network side.

Contract for implementations (both must behave the same, tests run against either):

* Broker-side failures raise :class:`broker_sim.common.errors.BrokerResponseError` (use
  ``error_for_code(code, remark)`` to turn a reply code back into the typed error).
* No reply in time raises :class:`broker_sim.common.errors.RequestTimeoutError`; for a send that means the
  outcome is unknown (the message may be stored: RocketMQ's duplicate-on-retry case).
* Connection problems raise :class:`broker_sim.common.errors.TransportError`.
* ``query_consumer_offset`` returns ``None`` for QUERY_NOT_FOUND (22).
* ``pull_message_async`` delivers exactly one callback, with the response or the exception, from any thread.
* ``broker_name`` (on requests and the per-queue offset calls) names the queue's broker group; ``""`` means
  the only broker (in-process) or any broker of the topic. A multi-group transport routes by it.
* ``heartbeat(data, channel)``: ``channel`` receives broker → client requests (transaction check-back,
consumer
  ids changed) for ``data.client_id``; an implementation must route them to it until ``unregister_client``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from broker_sim.clock import Clock
from broker_sim.common.broker_requests import BrokerRequests
from broker_sim.common.broker_requests import PullCallback as PullCallback
from broker_sim.common.requests import BatchEntry, SendMessageRequest, SendMessageResponse, TopicRouteData

log = logging.getLogger(__name__)

SendCallback = Callable[[SendMessageResponse | BaseException], None]


@runtime_checkable
class BrokerTransport(BrokerRequests, Protocol):
    """Requests a RocketMQ client sends (request code in brackets): those of :class:`BrokerRequests`, and
    the ones below, whose client form routes by ``broker_name`` or bounds a send by ``timeout_ms``."""

    @property
    def address(self) -> str:
        """Where requests go, for logs ("in-process:<store dir>" or "host:port" of the name server)."""
        ...

    def get_route(self, topic: str) -> TopicRouteData:
        """GET_ROUTEINFO_BY_TOPIC (105); raises TopicNotExistError (17) for an unknown topic."""
        ...

    def send_message(
        self, request: SendMessageRequest, body: bytes, timeout_ms: int = 3000
    ) -> SendMessageResponse:
        """SEND_MESSAGE (10/310)."""
        ...

    def send_message_oneway(self, request: SendMessageRequest, body: bytes) -> None:
        """SEND_MESSAGE with the oneway flag: no reply, errors are not reported."""
        ...

    def send_batch_message(
        self, request: SendMessageRequest, entries: Sequence[BatchEntry], timeout_ms: int = 3000
    ) -> SendMessageResponse:
        """SEND_BATCH_MESSAGE (320): all entries to ``request.topic``/``request.queue_id``."""
        ...

    def get_consumer_list(self, consumer_group: str, topic: str = "") -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP (38): client ids with a live heartbeat, asked of a broker of ``topic``
        (the one the group is rebalancing; any broker without one)."""
        ...

    def query_consumer_offset(
        self, consumer_group: str, topic: str, queue_id: int, broker_name: str = ""
    ) -> int | None:
        """QUERY_CONSUMER_OFFSET (14); None = QUERY_NOT_FOUND (22)."""
        ...

    def update_consumer_offset(
        self, consumer_group: str, topic: str, queue_id: int, offset: int, broker_name: str = ""
    ) -> None:
        """UPDATE_CONSUMER_OFFSET (15, oneway)."""
        ...

    def get_max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int:
        """GET_MAX_OFFSET (30): the next offset to be written."""
        ...

    def get_min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int:
        """GET_MIN_OFFSET (31)."""
        ...

    def search_offset_by_timestamp(
        self, topic: str, queue_id: int, timestamp_ms: int, broker_name: str = ""
    ) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP (29)."""
        ...

    def close(self) -> None:
        """Release connections; later calls raise TransportError."""
        ...


@runtime_checkable
class AsyncSendTransport(Protocol):
    """A transport that can have many sends in flight without a thread each (RocketMQ's async invoke: the
    request goes out now, the reply is matched by its ``opaque`` later). The producer's windowed
    ``send_async`` uses it when the transport has it, and a thread pool otherwise."""

    def send_message_async(
        self, request: SendMessageRequest, body: bytes, callback: SendCallback, timeout_ms: int = 3000
    ) -> None:
        """SEND_MESSAGE (10) without blocking the caller: ``callback`` gets exactly one response or error
        (RequestTimeoutError when no reply comes within ``timeout_ms``), from a library thread."""
        ...


@runtime_checkable
class TransportFactory(Protocol):
    """Something a client can be built on directly (an in-process Broker): it hands out its own transport,
    so the client package never imports the broker."""

    def client_transport(self) -> BrokerTransport: ...


@runtime_checkable
class ClockedTransport(Protocol):
    """A transport that shares its broker's clock (in-process), which the clients then use too."""

    @property
    def clock(self) -> Clock: ...
