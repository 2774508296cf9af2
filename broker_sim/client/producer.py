"""The producer: route lookup, queue selection, sync/async/oneway/batch send with retries.

A sync send tries up to ``1 + retry_times_when_send_failed`` times (RocketMQ default 3), each time on the next
queue and avoiding the broker that just failed, and all tries share one ``send_msg_timeout_ms`` budget (3 s),
as in RocketMQ 4.9.8's ``DefaultMQProducerImpl.sendDefaultImpl``. A *timeout* therefore spends the budget and
is not retried: the broker may have stored the message while only the reply was lost
(``broker.faults.lose_send_acks(n)``), and the caller gets :class:`SendFailedError` — resending it is then the
application's decision (``reliable``'s sweeper does that), which is where a duplicate with the same client id
(UNIQ_KEY) comes from. SYSTEM_BUSY is not retried either.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from broker_sim.client.async_send import SendWindow
from broker_sim.client.client_base import ClientBase, check_group, check_message
from broker_sim.client.selectors import (
    LatencyFaultTolerance,
    MessageQueueSelector,
    TopicPublishInfo,
    publish_route,
)
from broker_sim.client.send_retry import send_with_retries
from broker_sim.clock import Clock
from broker_sim.common.constants import is_retry_topic
from broker_sim.common.errors import (
    BrokerResponseError,
    ClientStateError,
    InvalidMessageError,
    SendFailedError,
    TransportError,
)
from broker_sim.common.message import (
    Message,
    MessageQueue,
    Prop,
    SendResult,
    SendStatus,
    SysFlag,
    new_uniq_key,
)
from broker_sim.common.requests import (
    BatchEntry,
    HeartbeatData,
    ResponseCode,
    SendMessageRequest,
    SendMessageResponse,
)
from broker_sim.common.scheduler import Scheduler
from broker_sim.common.service_state import ServiceState
from broker_sim.common.transport import AsyncSendTransport

log = logging.getLogger(__name__)

_STATUS = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


def _count(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InvalidMessageError(f"property {name} must be a whole number, got {value!r}") from None


class Producer(ClientBase):
    """``Producer(broker_or_address, group).send(Message(topic, body, keys=..., tags=...))``.

    Ready to use once constructed (``start()`` is implicit and idempotent); call :meth:`shutdown` when done.
    """

    def __init__(
        self,
        broker_or_address: object,
        group: str,
        *,
        clock: Clock | None = None,
        instance_name: str | None = None,
        retry_times_when_send_failed: int = 2,
        send_msg_timeout_ms: int = 3000,
        send_latency_fault_enable: bool = False,
        compress_msg_body_over: int = 4096,
        max_message_size: int = 4 * 1024 * 1024,
        default_topic_queue_nums: int = 4,
        heartbeat_interval_ms: int = 30_000,
        poll_name_server_interval_ms: int = 30_000,
        async_threads: int = 4,
        async_send_window: int = 65535,
        retry_times_when_send_async_failed: int = 2,
    ) -> None:
        check_group(group)
        super().__init__(broker_or_address, clock=clock, instance_name=instance_name)
        self.group = group
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.send_msg_timeout_ms = send_msg_timeout_ms
        self.send_latency_fault_enable = send_latency_fault_enable
        self.compress_msg_body_over = compress_msg_body_over
        self.max_message_size = max_message_size
        self.default_topic_queue_nums = default_topic_queue_nums
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.poll_name_server_interval_ms = poll_name_server_interval_ms
        self.fault_tolerance = LatencyFaultTolerance(self.clock.now_ms)
        self._publish: dict[str, TopicPublishInfo] = {}
        self._lock = threading.Lock()
        self._async_threads = async_threads
        self.async_send_window = async_send_window
        self.retry_times_when_send_async_failed = retry_times_when_send_async_failed
        self._executor: ThreadPoolExecutor | None = None
        self._window: SendWindow | None = None
        self._scheduler: Scheduler | None = None
        self._state: ServiceState = ServiceState.CREATED
        self.start()

    def __repr__(self) -> str:
        return f"Producer({self.group!r}, {self.client_id!r})"

    # -- life cycle -----------------------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._state == ServiceState.RUNNING:
                return
            if self._state == ServiceState.SHUTDOWN:
                raise ClientStateError("a producer cannot be restarted after shutdown")
            self._executor = ThreadPoolExecutor(self._async_threads, thread_name_prefix=f"send-{self.group}")
            if isinstance(self.transport, AsyncSendTransport):
                self._window = SendWindow(
                    self,
                    self.transport,
                    self.async_send_window,
                    self.retry_times_when_send_async_failed,
                    self._executor,
                )
            self._scheduler = Scheduler(self.clock, f"producer-{self.group}")
            self._state = ServiceState.RUNNING
        self.send_heartbeat()
        self._scheduler.schedule_periodic(
            self.heartbeat_interval_ms, self.heartbeat_interval_ms, self.send_heartbeat, name="heartbeat"
        )
        poll = self.poll_name_server_interval_ms
        self._scheduler.schedule_periodic(poll, poll, self.refresh_routes, name="route-poll")

    def shutdown(self) -> None:
        with self._lock:
            if self._state != ServiceState.RUNNING:
                self._state = ServiceState.SHUTDOWN
                return
            self._state = ServiceState.SHUTDOWN
        assert self._scheduler is not None and self._executor is not None
        self._scheduler.shutdown()
        self._executor.shutdown(wait=True)
        try:
            self.transport.unregister_client(self.client_id, self.group, None)
        except (TransportError, BrokerResponseError) as exc:
            log.warning("producer %s: unregister failed: %s", self.client_id, exc)
        self.transport.close()

    def send_heartbeat(self) -> None:
        try:
            self.transport.heartbeat(HeartbeatData(self.client_id, producer_groups=(self.group,)), self)
        except (TransportError, BrokerResponseError) as exc:
            log.warning("producer %s: heartbeat failed: %s", self.client_id, exc)

    def _check_running(self) -> None:
        if self._state != ServiceState.RUNNING:
            raise ClientStateError(f"producer {self.group} is {self._state}")

    # -- routes ---------------------------------------------------------------------------------------------

    def publish_info(self, topic: str, *, refresh: bool = False) -> TopicPublishInfo:
        """The topic's writable queues; falls back to ``TBW102``'s route when the topic has none yet."""
        with self._lock:
            info = self._publish.get(topic)
        if info is not None and not refresh and info.queues:
            return info
        route, from_default = publish_route(self.transport, topic, self.default_topic_queue_nums)
        info = TopicPublishInfo(topic, route)
        if not info.queues:
            raise BrokerResponseError(f"topic {topic} has no writable queue", int(ResponseCode.NO_PERMISSION))
        if not from_default:  # a borrowed route is looked up again next time, when the topic exists
            with self._lock:
                self._publish[topic] = info
        return info

    def refresh_routes(self) -> None:
        """Re-read every publish topic's route (every ``poll_name_server_interval_ms``, as 4.9.8's
        ``MQClientInstance``): queues an operator added are written to; a failed read keeps the known ones."""
        with self._lock:
            topics = list(self._publish)
        for topic in topics:
            try:
                self.publish_info(topic, refresh=True)
            except (TransportError, BrokerResponseError) as exc:
                log.warning("route of %s not re-read (the known queues stay in use): %s", topic, exc)

    def _route(self, topic: str) -> TopicPublishInfo:
        try:
            return self.publish_info(topic)
        except (TransportError, BrokerResponseError) as exc:
            raise SendFailedError(f"no route info of topic {topic}: {exc}") from exc

    def fetch_publish_message_queues(self, topic: str) -> list[MessageQueue]:
        return list(self.publish_info(topic).queues)

    # -- sending --------------------------------------------------------------------------------------------

    def _prepare(self, msg: Message) -> tuple[bytes, int]:
        check_message(msg, self.max_message_size)
        msg.properties.setdefault(Prop.UNIQ_KEY, new_uniq_key())
        body, sys_flag = bytes(msg.body), 0
        if len(body) >= self.compress_msg_body_over:
            body, sys_flag = zlib.compress(body, 5), SysFlag.COMPRESSED
        if msg.properties.get(Prop.TRAN_MSG) == "true":
            sys_flag |= SysFlag.TRANSACTION_PREPARED
        return body, sys_flag

    def _request(self, msg: Message, mq: MessageQueue, sys_flag: int) -> SendMessageRequest:
        props = dict(msg.properties)
        reconsume_times, max_reconsume_times = 0, None
        if is_retry_topic(msg.topic):
            # a retry copy the client sends itself: its counts travel in the header, where the broker
            # decides on the DLQ (DefaultMQProducerImpl.sendKernelImpl)
            reconsume_times = _count(props.pop(Prop.RECONSUME_TIME, "0"), Prop.RECONSUME_TIME)
            if Prop.MAX_RECONSUME_TIMES in props:
                max_reconsume_times = _count(props.pop(Prop.MAX_RECONSUME_TIMES), Prop.MAX_RECONSUME_TIMES)
        return SendMessageRequest(
            producer_group=self.group,
            topic=msg.topic,
            queue_id=mq.queue_id,
            properties=props,
            sys_flag=sys_flag,
            born_timestamp=self.clock.now_ms(),
            flag=msg.flag,
            reconsume_times=reconsume_times,
            max_reconsume_times=max_reconsume_times,
            default_topic_queue_nums=self.default_topic_queue_nums,
            broker_name=mq.broker_name,
        )

    def _result(self, msg: Message, mq: MessageQueue, resp: SendMessageResponse) -> SendResult:
        return SendResult(
            _STATUS.get(resp.code, SendStatus.SEND_OK),
            msg.properties[Prop.UNIQ_KEY],
            resp.queue_id,
            resp.queue_offset,
            resp.msg_id,
            msg.topic,
            mq.broker_name,
            resp.transaction_id,
        )

    def send(
        self,
        msg: Message,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
        *,
        queue: MessageQueue | None = None,
        timeout_ms: int | None = None,
    ) -> SendResult:
        """Send and wait for the broker's reply. ``selector(queues, msg, arg)`` or ``queue`` pin the queue
        (then there is no retry on another queue, as in RocketMQ). Raises SendFailedError after the last
        try."""
        self._check_running()
        body, sys_flag = self._prepare(msg)
        timeout = self.send_msg_timeout_ms if timeout_ms is None else timeout_ms
        info = self._route(msg.topic)
        if selector is not None or queue is not None:
            mq = queue if queue is not None else selector(info.queues, msg, arg)  # type: ignore[misc]
            try:
                return self._result(
                    msg, mq, self.transport.send_message(self._request(msg, mq, sys_flag), body, timeout)
                )
            except (TransportError, BrokerResponseError) as exc:
                raise SendFailedError(f"send to {mq} failed: {exc}") from exc
        mq, resp = send_with_retries(
            self,
            msg.topic,
            info,
            timeout,
            lambda mq, left: self.transport.send_message(self._request(msg, mq, sys_flag), body, left),
        )
        return self._result(msg, mq, resp)

    def _select(self, info: TopicPublishInfo, last_broker: str | None) -> MessageQueue:
        if self.send_latency_fault_enable:
            return self.fault_tolerance.select(info, last_broker)
        return info.select(last_broker)

    def _update_fault(self, mq: MessageQueue, begin_ms: int, *, isolation: bool) -> None:
        if self.send_latency_fault_enable:
            self.fault_tolerance.update(mq.broker_name, self.clock.now_ms() - begin_ms, isolation)

    def send_orderly(self, msg: Message, sharding_key: str) -> SendResult:
        """Same sharding key → same queue (``SelectMessageQueueByHash``)."""
        from broker_sim.client.selectors import select_by_hash

        msg.properties[Prop.SHARDING_KEY] = sharding_key
        return self.send(msg, select_by_hash, sharding_key)

    def send_async(
        self,
        msg: Message,
        on_success: Callable[[SendResult], None] | None = None,
        on_exception: Callable[[BaseException], None] | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
        *,
        timeout_ms: int | None = None,
    ) -> Future[SendResult]:
        """Send without waiting; the outcome goes to the returned Future and to the callbacks (which run on
        the producer's callback threads). Every failure, a bad message included, is delivered there.

        Over TCP the request is written at once and up to ``async_send_window`` sends are in flight on one
        connection (:mod:`broker_sim.client.async_send`); a full window makes this call wait for a slot, up
        to the send timeout. In process, the send runs on one of ``async_threads`` threads."""
        self._check_running()
        timeout = self.send_msg_timeout_ms if timeout_ms is None else timeout_ms
        if self._window is not None:
            return self._window.send(msg, on_success, on_exception, selector, arg, timeout)
        assert self._executor is not None
        future = self._executor.submit(self.send, msg, selector, arg, timeout_ms=timeout)

        def done(f: Future[SendResult]) -> None:
            exc = f.exception()
            try:
                if exc is None and on_success is not None:
                    on_success(f.result())
                elif exc is not None and on_exception is not None:
                    on_exception(exc)
            except Exception:
                log.exception("send callback raised")

        future.add_done_callback(done)
        return future

    def send_oneway(
        self, msg: Message, selector: MessageQueueSelector | None = None, arg: Any = None
    ) -> None:
        """Fire and forget: one attempt, no reply, no error (RocketMQ's oneway: used for logs)."""
        self._check_running()
        body, sys_flag = self._prepare(msg)
        info = self._route(msg.topic)
        mq = selector(info.queues, msg, arg) if selector is not None else info.select(None)
        self.transport.send_message_oneway(self._request(msg, mq, sys_flag), body)

    def send_batch(self, msgs: Sequence[Message], *, queue: MessageQueue | None = None) -> SendResult:
        """Send several messages of one topic as one request; they land on consecutive offsets of one queue.

        Delayed and transactional messages cannot be batched (RocketMQ refuses them too)."""
        self._check_running()
        if not msgs:
            raise InvalidMessageError("a batch needs at least one message")
        topic = msgs[0].topic
        entries = []
        for m in msgs:
            if m.topic != topic:
                raise InvalidMessageError("every message of a batch must have the same topic")
            if m.delay_time_level > 0 or m.properties.get(Prop.TRAN_MSG):
                raise InvalidMessageError("delayed or transactional messages cannot be batched")
            check_message(m, self.max_message_size)
            m.properties.setdefault(Prop.UNIQ_KEY, new_uniq_key())
            entries.append(BatchEntry(bytes(m.body), dict(m.properties), m.flag))
        if sum(len(e.body) for e in entries) > self.max_message_size:
            raise InvalidMessageError("the batch is larger than the maximum message size")
        info = self._route(topic)

        def request(mq: MessageQueue) -> SendMessageRequest:
            return SendMessageRequest(
                self.group, topic, mq.queue_id, {}, born_timestamp=self.clock.now_ms(), batch=True,
                default_topic_queue_nums=self.default_topic_queue_nums, broker_name=mq.broker_name,
            )  # fmt: skip

        def call(mq: MessageQueue, left: int) -> SendMessageResponse:
            return self.transport.send_batch_message(request(mq), entries, left)

        if queue is not None:  # a pinned queue: one attempt, as for a selector
            try:
                mq, resp = queue, call(queue, self.send_msg_timeout_ms)
            except (TransportError, BrokerResponseError) as exc:
                raise SendFailedError(f"batch send to {queue} failed: {exc}") from exc
        else:
            mq, resp = send_with_retries(self, topic, info, self.send_msg_timeout_ms, call)
        return SendResult(
            _STATUS.get(resp.code, SendStatus.SEND_OK),
            ",".join(m.properties[Prop.UNIQ_KEY] for m in msgs),
            resp.queue_id,
            resp.queue_offset,
            resp.msg_id,
            topic,
            mq.broker_name,
        )
