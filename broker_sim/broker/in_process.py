"""The in-process :class:`~broker_sim.common.transport.BrokerTransport`: client requests become direct
calls of the Broker's request-level methods, with the same fault injection the TCP server applies.

The requests of :class:`~broker_sim.common.broker_requests.BrokerRequests` have the same form on both
sides, so most of them are passed on by :func:`_forward`, which takes its signature from that protocol
(one list of methods for the transport, the Broker and this class); only the requests whose two forms
differ, or that need more than passing on, are written out here."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

from broker_sim.clock import Clock
from broker_sim.common.broker_api import BrokerApi
from broker_sim.common.broker_requests import BrokerRequests, PullCallback
from broker_sim.common.channels import ClientChannel
from broker_sim.common.errors import RequestTimeoutError, TransportError
from broker_sim.common.requests import (
    BatchEntry,
    HeartbeatData,
    PullMessageRequest,
    PullMessageResponse,
    SendMessageRequest,
    SendMessageResponse,
    TopicRouteData,
)

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


def _forward(
    method: Callable[Concatenate[BrokerRequests, P], R],
) -> Callable[Concatenate[InProcessTransport, P], R]:
    """A transport method that calls the Broker's method of the same name with the same arguments (after
    the closed check); typed by the protocol's ``method``, so mypy checks callers as for a written-out
    method."""
    name = method.__name__

    def call(self: InProcessTransport, /, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = getattr(self._check(), name)(*args, **kwargs)
        return result

    call.__name__, call.__qualname__ = name, f"InProcessTransport.{name}"
    call.__doc__ = method.__doc__
    return call


class InProcessTransport:
    """A :class:`BrokerTransport` that calls a Broker in this process.

    Fault injection that a network would cause is applied here the same way the TCP server applies it: a
    send whose ACK the injector drops is stored by the broker, then the caller gets RequestTimeoutError.
    """

    def __init__(self, broker: BrokerApi) -> None:
        self._broker = broker
        self._closed = False
        self._client_ids: set[str] = set()

    @property
    def broker(self) -> BrokerApi:
        return self._broker

    @property
    def address(self) -> str:
        return f"in-process:{self._broker.store_dir}"

    def _check(self) -> BrokerApi:
        if self._closed:
            raise TransportError("transport closed")
        return self._broker

    pull_message = _forward(BrokerRequests.pull_message)
    unregister_client = _forward(BrokerRequests.unregister_client)
    check_client_config = _forward(BrokerRequests.check_client_config)
    consumer_send_msg_back = _forward(BrokerRequests.consumer_send_msg_back)
    end_transaction = _forward(BrokerRequests.end_transaction)
    lock_batch_mq = _forward(BrokerRequests.lock_batch_mq)
    unlock_batch_mq = _forward(BrokerRequests.unlock_batch_mq)
    view_message_by_id = _forward(BrokerRequests.view_message_by_id)

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

    def get_consumer_list(self, consumer_group: str, topic: str = "") -> list[str]:
        return self._check().get_consumer_list_by_group(consumer_group)

    def query_consumer_offset(
        self, consumer_group: str, topic: str, queue_id: int, broker_name: str = ""
    ) -> int | None:
        return self._check().query_consumer_offset(consumer_group, topic, queue_id)

    def update_consumer_offset(
        self, consumer_group: str, topic: str, queue_id: int, offset: int, broker_name: str = ""
    ) -> None:
        self._check().update_consumer_offset(consumer_group, topic, queue_id, offset)

    def get_max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int:
        return self._check().get_max_offset(topic, queue_id)

    def get_min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int:
        return self._check().get_min_offset(topic, queue_id)

    def search_offset_by_timestamp(
        self, topic: str, queue_id: int, timestamp_ms: int, broker_name: str = ""
    ) -> int:
        return self._check().search_offset_by_timestamp(topic, queue_id, timestamp_ms)

    def close(self) -> None:
        """Like a TCP connection closing: the broker forgets the clients that heartbeated through it at
        once."""
        if self._closed:
            return
        self._closed = True
        if self._broker.running:
            for client_id in sorted(self._client_ids):
                self._broker.client_channel_closed(client_id)

    @property
    def clock(self) -> Clock:
        return self._broker.clock


if TYPE_CHECKING:  # mypy proves the in-process transport satisfies the client's transport protocol
    from broker_sim.common.transport import BrokerTransport

    _conforms: type[BrokerTransport] = InProcessTransport
