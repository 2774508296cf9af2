"""Windowed asynchronous sends: many sends in flight over one connection, no thread per send.

RocketMQ 4.9.8's async send writes the request at once and matches the broker's reply by its ``opaque``
(``NettyRemotingAbstract.invokeAsyncImpl``); a semaphore (``clientAsyncSemaphoreValue``, 65535) bounds how
many may be outstanding, and a caller who finds no permit within the send timeout gets "too many requests".
:class:`SendWindow` does the same on a transport that has ``send_message_async``
(:class:`~broker_sim.common.transport.AsyncSendTransport`, the TCP transport): ``Producer.send_async``
returns a Future at once, and a producer can keep a whole window of sends on the wire, which a thread pool
of 4 blocking sends cannot.

Failures follow ``DefaultMQProducerImpl``'s async path: a send that could not be written (connection refused
or lost) is tried again on another queue, up to ``retries`` more times within the one timeout budget; a
broker refusal or a timeout is final — after a timeout the message may be stored, so resending is the
application's decision, exactly as for a synchronous send.

Threads: the Future is completed on the thread that saw the outcome (the connection's reader, or its timer
for a timeout), so a done-callback added to the Future must be quick and must not wait — not for a
window slot either (a blocked reader answers nothing until the sends it waits for have timed out).
``on_success`` / ``on_exception`` run on the producer's callback threads instead, as RocketMQ runs
``SendCallback`` on its callback executor.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, Protocol

from broker_sim.client.selectors import MessageQueueSelector, TopicPublishInfo
from broker_sim.clock import Clock
from broker_sim.common.errors import BrokerResponseError, RequestTimeoutError, SendFailedError, TransportError
from broker_sim.common.message import Message, MessageQueue, SendResult
from broker_sim.common.requests import SendMessageRequest, SendMessageResponse
from broker_sim.common.transport import AsyncSendTransport

log = logging.getLogger(__name__)


class SendSide(Protocol):
    """What a window needs of its producer: queue choice, the request, the result, the fault bookkeeping."""

    @property
    def clock(self) -> Clock: ...

    def _prepare(self, msg: Message) -> tuple[bytes, int]: ...

    def _route(self, topic: str) -> TopicPublishInfo: ...

    def _select(self, info: TopicPublishInfo, last_broker: str | None) -> MessageQueue: ...

    def _request(self, msg: Message, mq: MessageQueue, sys_flag: int) -> SendMessageRequest: ...

    def _result(self, msg: Message, mq: MessageQueue, resp: SendMessageResponse) -> SendResult: ...

    def _update_fault(self, mq: MessageQueue, begin_ms: int, *, isolation: bool) -> None: ...


class _SendFuture(Future[SendResult]):
    """A send is under way from the moment its Future exists: it cannot be cancelled (``cancel`` returns
    False, as for a running Future, without the cost of marking it running)."""

    def cancel(self) -> bool:
        return False


class AsyncSend:
    """One message on its way: what every attempt needs, and where the outcome goes."""

    __slots__ = (
        "attempts_left", "begin_ms", "body", "done", "first_ms", "future", "info", "mq", "msg",
        "on_exception", "on_success", "pinned", "sys_flag", "timeout_ms",
    )  # fmt: skip

    def __init__(
        self,
        msg: Message,
        body: bytes,
        sys_flag: int,
        info: TopicPublishInfo | None,
        pinned: MessageQueue | None,
        timeout_ms: int,
        on_success: Callable[[SendResult], None] | None,
        on_exception: Callable[[BaseException], None] | None,
    ) -> None:
        self.msg, self.body, self.sys_flag, self.info, self.pinned = msg, body, sys_flag, info, pinned
        self.timeout_ms = timeout_ms
        self.on_success, self.on_exception = on_success, on_exception
        self.future: Future[SendResult] = _SendFuture()
        self.attempts_left = 0
        self.first_ms = self.begin_ms = 0
        self.mq: MessageQueue | None = None
        self.done = False


class WindowGate:
    """At most ``size`` holders; a caller who finds the window full waits until it has drained to the
    low-water mark (three quarters of ``size``), then the window is open again until it is full.

    Why the hysteresis: a sender blocked on a full window that resumed on every single reply would be woken,
    and would hand the GIL to and from the connection's reader, once per message; resuming at the low-water
    mark lets it write a run of sends per wake-up (window updates and write-buffer water marks do the same).
    The bound itself is exact: never more than ``size`` in flight."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.low = size - max(1, size // 4)
        self.in_flight = 0
        self._open = True
        self._cond = threading.Condition(threading.Lock())

    def _may_enter(self) -> bool:
        return self._open and self.in_flight < self.size

    def acquire(self, timeout_s: float) -> bool:
        with self._cond:
            if not self._may_enter() and not self._cond.wait_for(self._may_enter, timeout_s):
                return False
            self.in_flight += 1
            if self.in_flight >= self.size:
                self._open = False
            return True

    def release(self) -> None:
        with self._cond:
            self.in_flight -= 1
            if not self._open and self.in_flight <= self.low:
                self._open = True
                self._cond.notify_all()


class SendWindow:
    """At most ``size`` async sends of one producer outstanding at a time."""

    def __init__(
        self, side: SendSide, transport: AsyncSendTransport, size: int, retries: int, callbacks: Executor
    ) -> None:
        if size < 1:
            raise ValueError(f"the async send window must be at least 1, got {size}")
        self.side = side
        self.transport = transport
        self.size = size
        self.retries = retries
        self.callbacks = callbacks
        self._gate = WindowGate(size)

    def send(
        self,
        msg: Message,
        on_success: Callable[[SendResult], None] | None,
        on_exception: Callable[[BaseException], None] | None,
        selector: MessageQueueSelector | None,
        arg: Any,
        timeout_ms: int,
    ) -> Future[SendResult]:
        """``Producer.send_async`` on this window. A bad message or a missing route is reported through the
        Future and ``on_exception``, never raised (as RocketMQ's ``sendAsync``)."""
        try:
            body, sys_flag = self.side._prepare(msg)
            info = self.side._route(msg.topic)
            pinned = selector(info.queues, msg, arg) if selector is not None else None
        except Exception as exc:
            failed = AsyncSend(msg, b"", 0, None, None, timeout_ms, on_success, on_exception)
            self._complete(failed, exc, holds_slot=False)
            return failed.future
        return self.start(AsyncSend(msg, body, sys_flag, info, pinned, timeout_ms, on_success, on_exception))

    def start(self, send: AsyncSend) -> Future[SendResult]:
        """Take a slot (waiting up to the send's timeout for one) and write the first attempt."""
        if not self._gate.acquire(send.timeout_ms / 1000):
            self._complete(
                send,
                SendFailedError(
                    f"too many requests: {self.size} async sends still in flight after {send.timeout_ms} ms"
                ),
                holds_slot=False,
            )
            return send.future
        send.attempts_left = 1 + max(0, self.retries)
        send.first_ms = self.side.clock.now_ms()
        self._attempt(send)
        return send.future

    def _attempt(self, send: AsyncSend) -> None:
        side = self.side
        try:
            left = send.timeout_ms - (side.clock.now_ms() - send.first_ms)
            if left <= 0:
                raise SendFailedError(f"send to {send.msg.topic}: call timeout after {send.timeout_ms} ms")
            last = send.mq.broker_name if send.mq is not None else None
            if send.pinned is not None:
                mq = send.pinned
            else:
                assert send.info is not None
                mq = side._select(send.info, last)
            request = side._request(send.msg, mq, send.sys_flag)
        except Exception as exc:
            self._complete(send, exc)
            return
        send.mq, send.begin_ms = mq, side.clock.now_ms()
        send.attempts_left -= 1
        self.transport.send_message_async(
            request, send.body, lambda outcome: self._outcome(send, outcome), int(left)
        )

    def _outcome(self, send: AsyncSend, outcome: SendMessageResponse | BaseException) -> None:
        mq = send.mq
        assert mq is not None
        try:
            self.side._update_fault(mq, send.begin_ms, isolation=isinstance(outcome, BaseException))
            if not isinstance(outcome, BaseException):
                self._complete(send, self.side._result(send.msg, mq, outcome))
                return
            retry = (
                isinstance(outcome, TransportError)
                and not isinstance(outcome, RequestTimeoutError)
                and send.pinned is None
                and send.attempts_left > 0
            )
            if retry:
                log.warning(
                    "async send %s to %s failed, trying another queue: %s", send.msg.topic, mq, outcome
                )
                # not on this thread: it is the failed connection's, and the next attempt may connect
                try:
                    self.callbacks.submit(self._attempt, send)
                    return
                except RuntimeError:  # the producer is shutting down
                    pass
            if isinstance(outcome, BrokerResponseError):
                error: BaseException = SendFailedError(f"send to {mq} refused: {outcome}")
            else:
                error = SendFailedError(f"send to {mq} failed: {outcome}")
            error.__cause__ = outcome
            self._complete(send, error)
        except Exception as exc:  # a bug in the result path must still complete the send and free its slot
            self._complete(send, exc)

    def _complete(
        self, send: AsyncSend, outcome: SendResult | BaseException, *, holds_slot: bool = True
    ) -> None:
        if send.done:
            return
        send.done = True
        if holds_slot:
            self._gate.release()
        if isinstance(outcome, BaseException):
            send.future.set_exception(outcome)
            if send.on_exception is not None:
                on_exception, error = send.on_exception, outcome
                self._callback(lambda: on_exception(error))
        else:
            send.future.set_result(outcome)
            if send.on_success is not None:
                on_success, result = send.on_success, outcome
                self._callback(lambda: on_success(result))

    def _callback(self, fn: Callable[[], None]) -> None:
        def run() -> None:
            try:
                fn()
            except Exception:
                log.exception("send callback raised")

        try:
            self.callbacks.submit(run)
        except RuntimeError:  # the producer is shutting down: its callback threads are gone
            run()
