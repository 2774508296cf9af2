"""The client's only way to talk to a broker: a small protocol whose methods mirror RocketMQ requests.

Producers and consumers never touch a :class:`~broker_sim.broker.Broker` directly; they call a
:class:`BrokerTransport`. Two implementations exist:

* :class:`InProcessTransport` — calls the Broker's request-level methods in this process;
* ``broker_sim.remoting.client_transport.RemotingTransport`` — the same methods over RocketMQ's TCP remoting
  protocol (name server route lookup, then the broker master), written by the network side.

Contract for implementations (both must behave the same, tests run against either):

* Broker-side failures raise :class:`broker_sim.broker.errors.BrokerResponseError` (use
  ``error_for_code(code, remark)`` to turn a reply code back into the typed error).
* No reply in time raises :class:`broker_sim.client.errors.RequestTimeoutError`; for a send that means the
  outcome is unknown (the message may be stored: RocketMQ's duplicate-on-retry case).
* Connection problems raise :class:`broker_sim.client.errors.TransportError`.
* ``query_consumer_offset`` returns ``None`` for QUERY_NOT_FOUND (22).
* ``pull_message_async`` delivers exactly one callback, with the response or the exception, from any thread.
* ``heartbeat(data, channel)``: ``channel`` receives broker → client requests (transaction check-back,
consumer
  ids changed) for ``data.client_id``; an implementation must route them to it until ``unregister_client``.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from broker_sim.broker.api import (
    BatchEntry,
    ClientChannel,
    ConsumerSendMsgBackRequest,
    EndTransactionRequest,
    HeartbeatData,
    PullMessageRequest,
    PullMessageResponse,
    SendMessageRequest,
    SendMessageResponse,
    TopicRouteData,
)
from broker_sim.client.errors import RequestTimeoutError, TransportError
from broker_sim.client.message import MessageExt, MessageQueue

if TYPE_CHECKING:
    from broker_sim.broker.broker import Broker

log = logging.getLogger(__name__)

PullCallback = Callable[[PullMessageResponse | BaseException], None]


@runtime_checkable
class BrokerTransport(Protocol):
    """Requests a RocketMQ client sends (request code in brackets)."""

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

    def get_consumer_list(self, consumer_group: str) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP (38): client ids with a live heartbeat."""
        ...

    def query_consumer_offset(self, consumer_group: str, topic: str, queue_id: int) -> int | None:
        """QUERY_CONSUMER_OFFSET (14); None = QUERY_NOT_FOUND (22)."""
        ...

    def update_consumer_offset(self, consumer_group: str, topic: str, queue_id: int, offset: int) -> None:
        """UPDATE_CONSUMER_OFFSET (15, oneway)."""
        ...

    def get_max_offset(self, topic: str, queue_id: int) -> int:
        """GET_MAX_OFFSET (30): the next offset to be written."""
        ...

    def get_min_offset(self, topic: str, queue_id: int) -> int:
        """GET_MIN_OFFSET (31)."""
        ...

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP (29)."""
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

    def close(self) -> None:
        """Release connections; later calls raise TransportError."""
        ...


class InProcessTransport:
    """A :class:`BrokerTransport` that calls a Broker in this process.

    Fault injection that a network would cause is applied here the same way the TCP server applies it: a
    send whose ACK the injector drops is stored by the broker, then the caller gets RequestTimeoutError.
    """

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._closed = False
        self._client_ids: set[str] = set()

    @property
    def broker(self) -> Broker:
        return self._broker

    @property
    def address(self) -> str:
        return f"in-process:{self._broker.store_dir}"

    def _check(self) -> Broker:
        if self._closed:
            raise TransportError("transport closed")
        return self._broker

    def get_route(self, topic: str) -> TopicRouteData:
        return self._check().get_route_info_by_topic(topic)

    def send_message(
        self, request: SendMessageRequest, body: bytes, timeout_ms: int = 3000
    ) -> SendMessageResponse:
        from broker_sim.faults import SendAckLost

        try:
            return self._check().send_message(request, body)
        except SendAckLost as exc:
            raise RequestTimeoutError(f"send to {request.topic}: no reply within {timeout_ms} ms") from exc

    def send_message_oneway(self, request: SendMessageRequest, body: bytes) -> None:
        from broker_sim.faults import SendAckLost

        try:
            self._check().send_message(request, body)
        except SendAckLost:
            pass  # a oneway send never sees its ACK anyway; the injector already logged and counted it
        except Exception as exc:  # oneway: the sender is told nothing, as over the wire; the log says why
            log.warning("oneway send to %s failed: %s", request.topic, exc)

    def send_batch_message(
        self, request: SendMessageRequest, entries: Sequence[BatchEntry], timeout_ms: int = 3000
    ) -> SendMessageResponse:
        from broker_sim.faults import SendAckLost

        try:
            return self._check().send_batch_message(request, entries)
        except SendAckLost as exc:
            raise RequestTimeoutError(
                f"batch send to {request.topic}: no reply within {timeout_ms} ms"
            ) from exc

    def pull_message(self, request: PullMessageRequest, timeout_ms: int = 30_000) -> PullMessageResponse:
        done = threading.Event()
        box: list[PullMessageResponse | BaseException] = []

        def callback(result: PullMessageResponse | BaseException) -> None:
            box.append(result)
            done.set()

        self.pull_message_async(request, callback)
        if not self._broker.clock.wait(done, timeout_ms / 1000):
            raise RequestTimeoutError(
                f"pull {request.topic}:{request.queue_id}: no reply within {timeout_ms} ms"
            )
        result = box[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def pull_message_async(self, request: PullMessageRequest, callback: PullCallback) -> None:
        fired = threading.Event()

        def once(result: PullMessageResponse | BaseException) -> None:
            # Exactly one callback, and a callback that raises never looks like a failed request (which
            # would call it a second time and start a second pull loop for the queue).
            if fired.is_set():
                return
            fired.set()
            try:
                callback(result)
            except Exception:
                log.exception("pull callback for %s:%d raised", request.topic, request.queue_id)

        try:
            self._check().pull_message_async(request, once)
        except Exception as exc:  # delivered to the callback, as a network error reply would be
            once(exc)

    def heartbeat(self, data: HeartbeatData, channel: ClientChannel) -> None:
        self._check().heartbeat(data, channel)
        self._client_ids.add(data.client_id)

    def unregister_client(
        self, client_id: str, producer_group: str | None, consumer_group: str | None
    ) -> None:
        self._check().unregister_client(client_id, producer_group, consumer_group)

    def get_consumer_list(self, consumer_group: str) -> list[str]:
        return self._check().get_consumer_list_by_group(consumer_group)

    def query_consumer_offset(self, consumer_group: str, topic: str, queue_id: int) -> int | None:
        return self._check().query_consumer_offset(consumer_group, topic, queue_id)

    def update_consumer_offset(self, consumer_group: str, topic: str, queue_id: int, offset: int) -> None:
        self._check().update_consumer_offset(consumer_group, topic, queue_id, offset)

    def get_max_offset(self, topic: str, queue_id: int) -> int:
        return self._check().get_max_offset(topic, queue_id)

    def get_min_offset(self, topic: str, queue_id: int) -> int:
        return self._check().get_min_offset(topic, queue_id)

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return self._check().search_offset_by_timestamp(topic, queue_id, timestamp_ms)

    def consumer_send_msg_back(self, request: ConsumerSendMsgBackRequest) -> None:
        self._check().consumer_send_msg_back(request)

    def end_transaction(self, request: EndTransactionRequest) -> None:
        self._check().end_transaction(request)

    def lock_batch_mq(self, consumer_group: str, client_id: str, mqs: set[MessageQueue]) -> set[MessageQueue]:
        return self._check().lock_batch_mq(consumer_group, client_id, mqs)

    def unlock_batch_mq(self, consumer_group: str, client_id: str, mqs: set[MessageQueue]) -> None:
        self._check().unlock_batch_mq(consumer_group, client_id, mqs)

    def view_message_by_id(self, offset_msg_id: str) -> MessageExt:
        return self._check().view_message_by_id(offset_msg_id)

    def close(self) -> None:
        """Like a TCP connection closing: the broker forgets the clients that heartbeated through it at
        once."""
        if self._closed:
            return
        self._closed = True
        if self._broker.running:
            for client_id in sorted(self._client_ids):
                self._broker.client_channel_closed(client_id)


def transport_for(broker_or_address: object) -> BrokerTransport:
    """The transport for what a user passed: a Broker, a ready transport, or a ``"host:port"`` name server."""
    from broker_sim.broker.broker import Broker

    if isinstance(broker_or_address, Broker):
        return InProcessTransport(broker_or_address)
    if isinstance(broker_or_address, str):
        host, sep, port = broker_or_address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"broker address must be 'host:port', got {broker_or_address!r}")
        # Imported lazily (and by name, so this module never depends on the network layer being present).
        module = importlib.import_module("broker_sim.remoting.client_transport")
        transport: BrokerTransport = module.RemotingTransport(broker_or_address)
        return transport
    if isinstance(broker_or_address, BrokerTransport):
        return broker_or_address
    raise TypeError(
        f"expected a Broker, a 'host:port' string or a BrokerTransport, got {broker_or_address!r}"
    )
