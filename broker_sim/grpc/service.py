"""``apache.rocketmq.v2.MessagingService``: each RPC mapped onto Broker, :mod:`.pop` and :mod:`.timer` calls.

The servicer is a plain object whose method names are the service's (the generated
``add_MessagingServiceServicer_to_server`` only looks them up). Errors are answered the 5.x way — a
``Status`` with a ``Code`` in the response — not as gRPC errors, because the client decides retry versus
give-up from that code. RPCs broker_sim does not serve (PullMessage, UpdateOffset and GetOffset of the 5.x
pull consumer, RecallMessage, lite topics) answer gRPC ``UNIMPLEMENTED``; QueryOffset is served because
it is the 5.x way to ask a queue's max offset (the ``reliable`` loss probe).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from broker_sim.broker.api import EndTransactionRequest, TransactionType
from broker_sim.broker.constants import parse_tag_expression
from broker_sim.broker.errors import BrokerResponseError, TopicNotExistError
from broker_sim.errors import BrokerSimError
from broker_sim.grpc.convert import IllegalPropertyError, producer_group, to_pb_message, to_send_request
from broker_sim.grpc.peers import PeerGroups, QueueOffsets, UnknownBrokerError
from broker_sim.grpc.pop import PopService
from broker_sim.grpc.protocol import Protocol
from broker_sim.grpc.receipt import InvalidReceiptHandleError
from broker_sim.grpc.route import add_assignments, add_route, cluster_queues
from broker_sim.grpc.telemetry import TelemetryHub
from broker_sim.grpc.timer import TimerService
from broker_sim.store.message_record import decode_msg_id

if TYPE_CHECKING:
    from broker_sim.broker.broker import Broker

log = logging.getLogger("broker_sim.grpc.service")

#: invisible duration of push-consumer (auto-renew) deliveries: they ask for none; the broker renews them
#: while the client is connected (see PopService.renew and server.GrpcFrontEnd)
AUTO_RENEW_INVISIBLE_MS = 60_000
_MARGIN_S = 1.0  # answer a long poll this long before the client's deadline


def _metadata(context: Any, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return str(v)
    return ""


class MessagingService:
    def __init__(
        self,
        pb: Protocol,
        broker: Broker,
        pop: PopService,
        timer: TimerService,
        hub: TelemetryHub,
        peers: PeerGroups | None = None,
    ) -> None:
        self.pb = pb
        #: the cluster's other broker groups (``None``: a broker registered with no name server)
        self.peers = peers
        self.broker = broker
        self.pop = pop
        self.timer = timer
        self.hub = hub
        self._next_queue = itertools.count()
        self._stopping = threading.Event()
        self._waiting: set[object] = set()  # one token per ReceiveMessage long-polling for a connected client

    @property
    def waiting_receives(self) -> int:
        """ReceiveMessage calls long-polling for a message on behalf of a client still connected. A call
        stops counting as soon as the server sees its client go, before its loop notices: from then on it
        takes no message, so at 0 a message that becomes visible goes to the next live receive (what a
        caller waits for before it sends to a consumer that took over from one that went away)."""
        return len(self._waiting)

    def stop(self) -> None:
        self._stopping.set()

    def _status(self, target: Any, code: int, message: str = "OK") -> Any:
        target.status.code = code
        target.status.message = message
        return target

    def _error_code(self, exc: BaseException) -> int:
        d = self.pb.definition
        if isinstance(exc, TopicNotExistError):
            return int(d.TOPIC_NOT_FOUND)
        if isinstance(exc, InvalidReceiptHandleError):
            return int(d.INVALID_RECEIPT_HANDLE)
        if isinstance(exc, IllegalPropertyError):
            return int(d.ILLEGAL_MESSAGE_PROPERTY_KEY)
        if isinstance(exc, ValueError):
            return int(d.BAD_REQUEST)
        return int(d.INTERNAL_SERVER_ERROR)

    # -- routes and clients -------------------------------------------------------------------------------

    def QueryRoute(self, request: Any, context: Any) -> Any:
        """The topic's queues on every broker group of the cluster, each group's at its own endpoints."""
        d, s = self.pb.definition, self.pb.service
        resp = s.QueryRouteResponse()
        try:
            groups = cluster_queues(self.broker, self.peers, request.topic.name)
            add_route(self.pb, resp, request, groups)
        except TopicNotExistError as exc:
            return self._status(resp, d.TOPIC_NOT_FOUND, str(exc))
        return self._status(resp, d.OK)

    def Heartbeat(self, request: Any, context: Any) -> Any:
        self.hub.heartbeat(_metadata(context, "x-mq-client-id"))
        return self._status(self.pb.service.HeartbeatResponse(), self.pb.definition.OK)

    def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        client_id = _metadata(context, "x-mq-client-id")
        if client_id and self.broker.running:
            self.broker.client_channel_closed(client_id)
        return self._status(self.pb.service.NotifyClientTerminationResponse(), self.pb.definition.OK)

    def QueryAssignment(self, request: Any, context: Any) -> Any:
        """Pop consumers share every queue: one assignment per broker group of the cluster (queue -1 = all
        of its queues), each at that group's endpoints."""
        d, s = self.pb.definition, self.pb.service
        resp = s.QueryAssignmentResponse()
        try:
            groups = cluster_queues(self.broker, self.peers, request.topic.name)
            add_assignments(self.pb, resp, request, groups)
        except TopicNotExistError as exc:
            return self._status(resp, d.TOPIC_NOT_FOUND, str(exc))
        return self._status(resp, d.OK)

    def Telemetry(self, request_iterator: Any, context: Any) -> Iterator[Any]:
        channel = self.hub.open(_metadata(context, "x-mq-client-id"), context.peer())

        def read() -> None:
            try:
                for cmd in request_iterator:
                    self.hub.on_command(channel, cmd)
            except grpc.RpcError as exc:
                log.debug("telemetry stream of %s ended: %s", channel.client_id, exc)
            finally:
                self.hub.close(channel)

        threading.Thread(target=read, name=f"telemetry-{channel.client_id}", daemon=True).start()
        context.add_callback(channel.close)
        yield from channel.commands()

    # -- send and transactions ----------------------------------------------------------------------------

    def _queue_for(self, topic: str, msg: Any) -> int:
        tc = self.broker.topics.select(topic)
        if tc is None:
            raise TopicNotExistError(f"topic {topic} does not exist")
        group = msg.system_properties.message_group
        if group:  # FIFO: one message group, one queue
            return zlib.crc32(group.encode()) % tc.write_queue_nums
        return next(self._next_queue) % tc.write_queue_nums

    def SendMessage(self, request: Any, context: Any) -> Any:
        d, s = self.pb.definition, self.pb.service
        resp = s.SendMessageResponse()
        for msg in request.messages:
            entry = resp.entries.add()
            try:
                req, body, deliver_ms = to_send_request(self.pb, msg, self._queue_for(msg.topic.name, msg))
                if deliver_ms is not None and deliver_ms > self.broker.clock.now_ms():
                    self.timer.park(req, body, deliver_ms)
                    entry.offset = -1
                else:
                    sent = self.broker.send_message(req, body)
                    entry.offset = sent.queue_offset
                    if sent.transaction_id is not None:
                        entry.transaction_id = sent.msg_id
                entry.message_id = msg.system_properties.message_id
                self._status(entry, d.OK)
            except (BrokerSimError, ValueError) as exc:
                log.info("send to %s refused: %s", msg.topic.name, exc)
                self._status(entry, self._error_code(exc), str(exc))
        first = resp.entries[0].status if resp.entries else None
        if first is None:
            return self._status(resp, d.BAD_REQUEST, "no message to send")
        return self._status(resp, first.code, first.message)

    def EndTransaction(self, request: Any, context: Any) -> Any:
        d, s = self.pb.definition, self.pb.service
        resp = s.EndTransactionResponse()
        try:
            _, clog = decode_msg_id(request.transaction_id)
        except BrokerSimError as exc:
            return self._status(resp, d.INVALID_TRANSACTION_ID, str(exc))
        outcome = (
            TransactionType.COMMIT
            if request.resolution == d.COMMIT
            else TransactionType.ROLLBACK
            if request.resolution == d.ROLLBACK
            else TransactionType.NOT_TYPE
        )
        try:
            self.broker.end_transaction(
                EndTransactionRequest(
                    producer_group(request.topic.name), request.transaction_id, request.message_id, 0, clog,
                    outcome, from_transaction_check=request.source == d.SOURCE_SERVER_CHECK,
                )
            )  # fmt: skip
        except BrokerResponseError as exc:
            return self._status(resp, d.INVALID_TRANSACTION_ID, str(exc))
        return self._status(resp, d.OK)

    # -- receive, ack, invisible duration, dead letter ----------------------------------------------------

    def ReceiveMessage(self, request: Any, context: Any) -> Iterator[Any]:
        d, s = self.pb.definition, self.pb.service
        group, topic = request.group.name, request.message_queue.topic.name
        try:
            if request.filter_expression.type not in (d.FILTER_TYPE_UNSPECIFIED, d.TAG):
                raise ValueError("broker_sim filters by tag only (no SQL92)")
            tags = parse_tag_expression(request.filter_expression.expression)
        except ValueError as exc:
            yield self._status(s.ReceiveMessageResponse(), d.ILLEGAL_FILTER_EXPRESSION, str(exc))
            return
        if self.broker.topics.select(topic) is None:
            yield self._status(s.ReceiveMessageResponse(), d.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
            return
        invisible = request.invisible_duration
        invisible_ms = invisible.seconds * 1000 + invisible.nanos // 1_000_000 or AUTO_RENEW_INVISIBLE_MS
        poll_s = float(request.long_polling_timeout.seconds or self.hub.long_polling_s)
        remaining = context.time_remaining()
        if remaining is not None:
            poll_s = min(poll_s, remaining - _MARGIN_S)
        deadline = time.monotonic() + poll_s
        batch = max(1, request.batch_size)
        owner = _metadata(context, "x-mq-client-id") if request.auto_renew else None
        found: list[Any] = []
        token = object()
        self._waiting.add(token)
        context.add_callback(lambda: self._waiting.discard(token))  # runs once the client is seen gone
        try:
            # a call whose client went away (its connection closed while it waited) takes no message: what
            # it popped would stay invisible, held for nobody, until its invisible time ran out
            while context.is_active() and not self._stopping.is_set():
                found = self.pop.pop(group, topic, batch, invisible_ms, tags, owner)
                if found or time.monotonic() >= deadline:
                    break
                self.pop.wait(min(0.1, max(0.0, deadline - time.monotonic())))
        finally:
            self._waiting.discard(token)
        if found:  # the client measures receive latency from this (and fails without it)
            stamp = s.ReceiveMessageResponse()
            stamp.delivery_timestamp.FromMilliseconds(self.broker.clock.now_ms())
            yield stamp
        for delivery in self._fifo_order(found):
            yield s.ReceiveMessageResponse(message=to_pb_message(self.pb, delivery.message, delivery))
        if found:
            yield self._status(s.ReceiveMessageResponse(), d.OK)
        else:
            yield self._status(s.ReceiveMessageResponse(), d.MESSAGE_NOT_FOUND, "no new message")

    @staticmethod
    def _fifo_order(found: list[Any]) -> list[Any]:
        """Queue order, so a FIFO message group's messages reach the client in the order they were sent."""
        return sorted(found, key=lambda x: (x.handle.queue_id, x.handle.queue_offset))

    def AckMessage(self, request: Any, context: Any) -> Any:
        d, s = self.pb.definition, self.pb.service
        resp = s.AckMessageResponse()
        for e in request.entries:
            entry = resp.entries.add(message_id=e.message_id, receipt_handle=e.receipt_handle)
            try:
                self.pop.ack(request.group.name, request.topic.name, e.receipt_handle)
                self._status(entry, d.OK)
            except InvalidReceiptHandleError as exc:
                self._status(entry, d.INVALID_RECEIPT_HANDLE, str(exc))
        codes = {e.status.code for e in resp.entries}
        if len(resp.entries) == 1 or len(codes) == 1:
            return self._status(resp, resp.entries[0].status.code, resp.entries[0].status.message)
        return self._status(resp, d.MULTIPLE_RESULTS, "some entries failed")

    def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        d, s = self.pb.definition, self.pb.service
        resp = s.ChangeInvisibleDurationResponse()
        dur = request.invisible_duration
        try:
            handle = self.pop.change_invisible(
                request.group.name, request.topic.name, request.receipt_handle,
                dur.seconds * 1000 + dur.nanos // 1_000_000,
            )  # fmt: skip
        except InvalidReceiptHandleError as exc:
            return self._status(resp, d.INVALID_RECEIPT_HANDLE, str(exc))
        resp.receipt_handle = handle.encode()
        return self._status(resp, d.OK)

    def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        d, s = self.pb.definition, self.pb.service
        resp = s.ForwardMessageToDeadLetterQueueResponse()
        try:
            self.pop.forward_to_dlq(request.group.name, request.topic.name, request.receipt_handle)
        except (InvalidReceiptHandleError, BrokerSimError) as exc:
            return self._status(resp, self._error_code(exc), str(exc))
        return self._status(resp, d.OK)

    def QueryOffset(self, request: Any, context: Any) -> Any:
        """A queue's first or next-to-write offset (or the offset at a time): the 5.x loss probe. The queue
        is the broker group's its message queue names — this broker's, or another group's of the cluster,
        asked through the name servers as the 5.x proxy does (:mod:`.peers`); no name: this broker's."""
        d, s = self.pb.definition, self.pb.service
        resp = s.QueryOffsetResponse()
        mq = request.message_queue
        topic, name = mq.topic.name, mq.broker.name
        try:
            source = self._offsets_of(topic, name)
            if request.query_offset_policy == d.BEGINNING:
                resp.offset = source.get_min_offset(topic, mq.id)
            elif request.query_offset_policy == d.END:
                resp.offset = source.get_max_offset(topic, mq.id)
            else:
                ts = request.timestamp
                resp.offset = source.search_offset_by_timestamp(
                    topic, mq.id, ts.seconds * 1000 + ts.nanos // 1_000_000
                )
        except TopicNotExistError:
            return self._status(resp, d.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        except UnknownBrokerError:
            return self._status(resp, d.BAD_REQUEST, f"cannot find broker {name}")
        except BrokerSimError as exc:  # the other group's broker could not be asked
            log.warning("QueryOffset of %s queue %d on %s failed: %s", topic, mq.id, name, exc)
            return self._status(resp, d.INTERNAL_SERVER_ERROR, f"broker {name}: {exc}")
        return self._status(resp, d.OK)

    def _offsets_of(self, topic: str, broker_name: str) -> QueueOffsets:
        if not broker_name or broker_name == self.broker.config.broker_name:
            if self.broker.topics.select(topic) is None:
                raise TopicNotExistError(f"topic {topic} does not exist")
            return self.broker
        if self.peers is None:  # a broker without name servers knows no other group
            raise UnknownBrokerError(f"cannot find broker {broker_name}")
        return self.peers.group(topic, broker_name)

    # -- not served ----------------------------------------------------------------------------------------

    def _unimplemented(self, request: Any, context: Any) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not served by broker_sim's gRPC front end")

    PullMessage = UpdateOffset = GetOffset = _unimplemented
    RecallMessage = SyncLiteSubscription = _unimplemented
