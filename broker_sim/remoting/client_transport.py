"""``RemotingTransport``: the client's :class:`~broker_sim.client.transport.BrokerTransport` over TCP.

``Producer("127.0.0.1:9876", group)`` ends up here (through ``transport_for``). The address is the name
server's; broker addresses come from topic routes (GET_ROUTEINFO_BY_TOPIC) or, for requests that name no
topic (heartbeat, unregistration), from the cluster info (GET_BROKER_CLUSTER_INFO). A consumer list or a
client config check goes to a master of the topic at random and on to the next when one does not answer;
heartbeats go to every master at once and return when one has taken it. Behaviour matches
the in-process transport: broker reply codes become the same typed errors (``error_for_code``), a missing
reply is :class:`RequestTimeoutError`, a broken connection :class:`TransportError`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from broker_sim.common.channels import ClientChannel
from broker_sim.common.errors import BrokerResponseError, TransportError, error_for_code
from broker_sim.common.message import MessageExt, MessageQueue, decode_offset_msg_id
from broker_sim.common.requests import (
    BatchEntry,
    ConsumerSendMsgBackRequest,
    EndTransactionRequest,
    HeartbeatData,
    PullMessageRequest,
    PullMessageResponse,
    ResponseCode,
    SendMessageRequest,
    SendMessageResponse,
    SubscriptionData,
    TopicRouteData,
)
from broker_sim.common.transport import PullCallback, SendCallback
from broker_sim.remoting import bodies
from broker_sim.remoting.acl import sign
from broker_sim.remoting.client import RemotingConnection, ReplyCallback
from broker_sim.remoting.client_codec import (
    by_broker,
    check,
    end_transaction_fields,
    pull_fields,
    pull_response,
    reply_errors,
    send_back_fields,
    send_fields,
    send_response,
)
from broker_sim.remoting.client_requests import serve_client_request
from broker_sim.remoting.codes import RequestCode
from broker_sim.remoting.errors import RemotingError
from broker_sim.remoting.frame import RemotingCommand
from broker_sim.remoting.header import Fields
from broker_sim.remoting.locator import BrokerLocator
from broker_sim.remoting.records import decode_record

log = logging.getLogger("broker_sim.remoting.client_transport")


T = TypeVar("T")


class RemotingTransport:
    """All requests of a RocketMQ client, over TCP, starting from a name server address."""

    def __init__(
        self,
        namesrv_addr: str,
        *,
        request_timeout_ms: int = 3000,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        self._namesrv_addr = namesrv_addr
        self._credentials = (access_key, secret_key or "") if access_key else None
        self._timeout_s = request_timeout_ms / 1000
        self._lock = threading.Lock()
        self._conns: dict[str, RemotingConnection] = {}
        self._channels: dict[str, ClientChannel] = {}
        self._closed = False
        #: where the name servers and each group's master and slaves are
        self.locator = BrokerLocator(namesrv_addr, self._invoke, self._req)
        self._brokers = self.locator.directory
        self._ask_namesrv = self.locator.ask_namesrv
        self._broker = self.locator.broker
        self._broker_of = self.locator.broker_of
        self._masters = self.locator.masters

    @property
    def address(self) -> str:
        return self._namesrv_addr

    # -- plumbing --

    def _req(
        self,
        code: int,
        fields: Mapping[str, object] | None = None,
        body: bytes = b"",
        *,
        oneway: bool = False,
    ) -> RemotingCommand:
        """A request, signed for the broker's ACL check when this transport has credentials."""
        cmd = RemotingCommand.request(code, fields, body, oneway=oneway)
        if self._credentials is not None:
            sign(cmd, *self._credentials)
        return cmd

    def _conn(self, address: str) -> RemotingConnection:
        with self._lock:
            if self._closed:
                raise TransportError("transport closed")
            conn = self._conns.get(address)
            if conn is None:
                conn = RemotingConnection(address, on_request=self._server_request)
                self._conns[address] = conn
            return conn

    def _invoke(self, address: str, cmd: RemotingCommand, timeout_s: float | None = None) -> RemotingCommand:
        try:
            return self._conn(address).invoke(cmd, self._timeout_s if timeout_s is None else timeout_s)
        except TransportError:
            self._brokers.forget(address)
            raise

    _ok = staticmethod(check)

    def _to_all_masters(self, request: Callable[[], RemotingCommand], *, wait_all: bool = True) -> None:
        """Send to every master at once; a group that does not answer is skipped (logged), as Java's client
        does, unless none answers. Returns when every master has answered or timed out, or — without
        ``wait_all`` (heartbeats) — as soon as one has accepted it: a hung master then delays nobody (the
        others' requests run on, their failures logged). A later request to a master that has not answered
        yet still finds the client registered: it follows the heartbeat on the same connection, and the
        broker handles HEART_BEAT on that connection's reader thread, in order."""
        masters = self._masters()
        done = threading.Condition()
        failures: list[BaseException] = []
        accepted: list[str] = []

        def on_reply(addr: str) -> ReplyCallback:
            def reply(result: RemotingCommand | BaseException) -> None:
                try:
                    if isinstance(result, BaseException):
                        raise result
                    self._ok(result)
                except (TransportError, BrokerResponseError) as exc:
                    if isinstance(exc, TransportError):
                        self._brokers.forget(addr)
                    log.debug("request to broker %s failed: %s", addr, exc)
                    with done:
                        failures.append(exc)
                        done.notify_all()
                    return
                with done:
                    accepted.append(addr)
                    done.notify_all()

            return reply

        for addr in masters:
            try:
                conn = self._conn(addr)
            except TransportError as exc:
                on_reply(addr)(exc)
                continue
            conn.invoke_async(request(), on_reply(addr), self._timeout_s)

        def finished() -> bool:
            return len(failures) + len(accepted) == len(masters) or (not wait_all and bool(accepted))

        with done:
            done.wait_for(finished)  # every request gets its callback by its deadline
            if not accepted and failures:  # (no master known yet: nothing to tell, as Java's client)
                raise failures[-1]

    # -- server -> client requests --

    @reply_errors
    def _server_request(self, cmd: RemotingCommand) -> RemotingCommand | None:
        with self._lock:
            channels = dict(self._channels)
        return serve_client_request(cmd, channels)

    # -- routes --

    def get_route(self, topic: str) -> TopicRouteData:
        return self.locator.get_route(topic)

    # -- send --

    @reply_errors
    def send_message(
        self, request: SendMessageRequest, body: bytes, timeout_ms: int = 3000
    ) -> SendMessageResponse:
        cmd = self._req(RequestCode.SEND_MESSAGE, send_fields(request), body)
        return send_response(
            self._invoke(self._broker_of(request.broker_name, request.topic), cmd, timeout_ms / 1000)
        )

    def send_message_async(
        self, request: SendMessageRequest, body: bytes, callback: SendCallback, timeout_ms: int = 3000
    ) -> None:
        """The request is written now; the broker's reply, matched by its opaque on the connection's reader
        thread, goes to ``callback`` (as do a timeout and a lost connection)."""
        try:
            addr = self._broker_of(request.broker_name, request.topic)
            conn = self._conn(addr)
        except Exception as exc:  # delivered to the callback, as the transport contract says
            callback(exc)
            return

        cmd = self._req(RequestCode.SEND_MESSAGE, send_fields(request), body)
        conn.invoke_async(cmd, self._async_reply(addr, send_response, callback), timeout_ms / 1000)

    def send_message_oneway(self, request: SendMessageRequest, body: bytes) -> None:
        cmd = self._req(RequestCode.SEND_MESSAGE, send_fields(request), body, oneway=True)
        try:
            self._conn(self._broker_of(request.broker_name, request.topic)).invoke_oneway(cmd)
        except TransportError:
            log.debug("oneway send to %s failed", request.topic, exc_info=True)

    @reply_errors
    def send_batch_message(
        self, request: SendMessageRequest, entries: Sequence[BatchEntry], timeout_ms: int = 3000
    ) -> SendMessageResponse:
        cmd = self._req(RequestCode.SEND_BATCH_MESSAGE, send_fields(request), bodies.encode_batch(entries))
        return send_response(
            self._invoke(self._broker_of(request.broker_name, request.topic), cmd, timeout_ms / 1000)
        )

    # -- pull --

    def _pull_timeout_s(self, request: PullMessageRequest) -> float:
        return request.suspend_timeout_ms / 1000 + self._timeout_s + 5.0

    @reply_errors
    def pull_message(self, request: PullMessageRequest, timeout_ms: int = 30_000) -> PullMessageResponse:
        addr, request = self.locator.pull_target(request)
        cmd = self._req(RequestCode.PULL_MESSAGE, pull_fields(request))
        timeout = max(timeout_ms / 1000, self._pull_timeout_s(request))
        return pull_response(self._invoke(addr, cmd, timeout), request.broker_name or self._name_of(addr))

    def pull_message_async(self, request: PullMessageRequest, callback: PullCallback) -> None:
        try:
            addr, request = self.locator.pull_target(request)
            conn = self._conn(addr)
        except Exception as exc:  # delivered to the callback, as the transport contract says
            callback(exc)
            return
        name = request.broker_name or self._name_of(addr)
        on_reply = self._async_reply(addr, lambda reply: pull_response(reply, name), callback)
        cmd = self._req(RequestCode.PULL_MESSAGE, pull_fields(request))
        conn.invoke_async(cmd, on_reply, self._pull_timeout_s(request))

    def _async_reply(
        self, addr: str, decode: Callable[[RemotingCommand], T], callback: Callable[[T | BaseException], None]
    ) -> ReplyCallback:
        """The reply hook of an async request: ``callback`` gets the decoded response or the error (a lost
        connection also drops ``addr`` from the directory; an undecodable reply is a TransportError)."""

        def on_reply(result: RemotingCommand | BaseException) -> None:
            if isinstance(result, BaseException):
                if isinstance(result, TransportError):
                    self._brokers.forget(addr)
                callback(result)
                return
            try:
                response = decode(result)
            except RemotingError as exc:
                callback(TransportError(f"undecodable reply: {exc}"))
                return
            except Exception as exc:  # a typed broker error, delivered as the contract says
                callback(exc)
                return
            callback(response)

        return on_reply

    def _name_of(self, addr: str) -> str:
        return self._brokers.name_of(addr)

    # -- clients --

    def heartbeat(self, data: HeartbeatData, channel: ClientChannel) -> None:
        with self._lock:
            self._channels[data.client_id] = channel
        body = bodies.heartbeat_body(data)
        self._to_all_masters(lambda: self._req(RequestCode.HEART_BEAT, body=body), wait_all=False)

    def unregister_client(
        self, client_id: str, producer_group: str | None, consumer_group: str | None
    ) -> None:
        fields = {
            "clientID": client_id,
            "producerGroup": producer_group or "",
            "consumerGroup": consumer_group or "",
        }
        try:
            self._to_all_masters(lambda: self._req(RequestCode.UNREGISTER_CLIENT, fields))
        finally:
            with self._lock:
                self._channels.pop(client_id, None)

    def _invoke_any(self, topic: str, request: Callable[[], RemotingCommand]) -> RemotingCommand:
        """A request any master of ``topic`` can answer: to one of them at random, then to the next while
        they do not answer (:meth:`BrokerLocator.any_master_of`)."""
        last: TransportError | None = None
        for addr in self.locator.any_master_of(topic):
            try:
                return self._invoke(addr, request())
            except TransportError as exc:
                log.info("broker %s did not answer (%s); asking another broker of %s", addr, exc, topic)
                last = exc
        raise last or TransportError(f"no broker of {topic} known")

    @reply_errors
    def get_consumer_list(self, consumer_group: str, topic: str = "") -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP to a master of ``topic`` (``MQClientInstance.findConsumerIdList``)."""
        fields = {"consumerGroup": consumer_group}
        reply = self._invoke_any(topic, lambda: self._req(RequestCode.GET_CONSUMER_LIST_BY_GROUP, fields))
        if reply.code != ResponseCode.SUCCESS:
            return []
        ids = bodies.load_json(reply.body, "consumer list").get("consumerIdList") or []
        return [str(i) for i in ids]

    @reply_errors
    def check_client_config(
        self, consumer_group: str, client_id: str, subscription: SubscriptionData
    ) -> None:
        body = bodies.check_client_body(consumer_group, client_id, subscription)
        reply = self._invoke_any(
            subscription.topic, lambda: self._req(RequestCode.CHECK_CLIENT_CONFIG, body=body)
        )
        if reply.code != ResponseCode.SUCCESS:
            raise error_for_code(reply.code, reply.remark or "")

    # -- offsets --

    @reply_errors
    def query_consumer_offset(
        self, consumer_group: str, topic: str, queue_id: int, broker_name: str = ""
    ) -> int | None:
        fields = {"consumerGroup": consumer_group, "topic": topic, "queueId": queue_id}
        reply = self._invoke(
            self._broker_of(broker_name, topic, read=True),
            self._req(RequestCode.QUERY_CONSUMER_OFFSET, fields),
        )
        if reply.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        return Fields(self._ok(reply).ext_fields).num("offset")

    def update_consumer_offset(
        self, consumer_group: str, topic: str, queue_id: int, offset: int, broker_name: str = ""
    ) -> None:
        fields = {
            "consumerGroup": consumer_group,
            "topic": topic,
            "queueId": queue_id,
            "commitOffset": offset,
        }
        cmd = self._req(RequestCode.UPDATE_CONSUMER_OFFSET, fields, oneway=True)
        addr = self._broker_of(broker_name, topic, read=True)
        try:
            self._conn(addr).invoke_oneway(cmd)
        except TransportError:
            self._brokers.forget(addr)
            raise

    @reply_errors
    def _offset_request(self, code: int, topic: str, queue_id: int, broker_name: str, **extra: int) -> int:
        cmd = self._req(code, {"topic": topic, "queueId": queue_id, **extra})
        reply = self._invoke(self._broker_of(broker_name, topic, read=True), cmd)
        return Fields(self._ok(reply).ext_fields).num("offset")

    def get_max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int:
        return self._offset_request(RequestCode.GET_MAX_OFFSET, topic, queue_id, broker_name)

    def get_min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int:
        return self._offset_request(RequestCode.GET_MIN_OFFSET, topic, queue_id, broker_name)

    def search_offset_by_timestamp(
        self, topic: str, queue_id: int, timestamp_ms: int, broker_name: str = ""
    ) -> int:
        return self._offset_request(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic, queue_id, broker_name, timestamp=timestamp_ms
        )

    # -- messages --

    def consumer_send_msg_back(self, request: ConsumerSendMsgBackRequest) -> None:
        cmd = self._req(RequestCode.CONSUMER_SEND_MSG_BACK, send_back_fields(request))
        self._ok(self._invoke(self._broker(request.broker_name or None), cmd))

    def end_transaction(self, request: EndTransactionRequest) -> None:
        cmd = self._req(RequestCode.END_TRANSACTION, end_transaction_fields(request), oneway=True)
        try:  # the half message's own broker: its address is in the offset message id
            addr = decode_offset_msg_id(request.msg_id)[0]
        except ValueError:
            addr = self._broker(request.broker_name or None)
        self._conn(addr).invoke_oneway(cmd)

    @reply_errors
    def lock_batch_mq(self, consumer_group: str, client_id: str, mqs: set[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ to each queue's own broker group (RebalanceImpl.lockAll groups them by broker)."""
        out: set[MessageQueue] = set()
        for name, group in by_broker(mqs).items():
            body = bodies.lock_body(consumer_group, client_id, group)
            reply = self._ok(
                self._invoke(self._broker(name or None), self._req(RequestCode.LOCK_BATCH_MQ, body=body))
            )
            locked = bodies.load_json(reply.body, "lock reply").get("lockOKMQSet") or []
            out |= {bodies.mq_from_json(m) for m in locked}
        return out

    def unlock_batch_mq(self, consumer_group: str, client_id: str, mqs: set[MessageQueue]) -> None:
        for name, group in by_broker(mqs).items():
            body = bodies.lock_body(consumer_group, client_id, group)
            self._ok(
                self._invoke(self._broker(name or None), self._req(RequestCode.UNLOCK_BATCH_MQ, body=body))
            )

    @reply_errors
    def view_message_by_id(self, offset_msg_id: str) -> MessageExt:
        try:
            store_host, offset = decode_offset_msg_id(offset_msg_id)
        except ValueError as exc:
            raise error_for_code(
                ResponseCode.SYSTEM_ERROR, f"bad message id {offset_msg_id!r}: {exc}"
            ) from None
        cmd = self._req(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
        reply = self._ok(self._invoke(store_host, cmd))
        return decode_record(reply.body, broker_name=self._name_of(store_host))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = list(self._conns.values())
            self._conns.clear()
        for c in conns:
            c.close()


if TYPE_CHECKING:  # mypy proves the TCP transport satisfies the client's transport protocols
    from broker_sim.common.transport import AsyncSendTransport, BrokerTransport

    _conforms: type[BrokerTransport] = RemotingTransport
    _async: type[AsyncSendTransport] = RemotingTransport
