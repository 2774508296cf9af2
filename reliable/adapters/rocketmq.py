"""RocketMQ 4.x adapter for the official Python client (PyPI ``rocketmq`` 0.4.4, the C++ client via ctypes).

Two parts, both tested against ``broker-sim serve`` (tests/adapters/test_rocketmq_adapter.py):

* :class:`RocketMQSender` — the :class:`~reliable.sender.Sender` of the stub-first producer and the sweeper.
  The 0.4.4 ``SendResult`` carries ``(status, msg_id, offset)`` but no queue id, and the sweeper needs the
  queue to compare the offset with the right watermark. So the sender picks the queue itself through
  ``send_orderly`` with a round-robin selector and records the index it chose, mapped to (broker group,
  queue id) through the name server's route by :class:`QueueBook` (the client's list is built from that
  route in a known order; with one broker and no probe the index *is* the queue id). The client's own
  retry would move a failed send to a queue of *another* broker group without asking the selector
  (``sendAutoRetrySelectImpl``), so the offset would belong to a queue nobody recorded: the sender asks
  the client for one attempt at a time and retries itself, each attempt through the selector (the next
  index), so the receipt names the queue of the attempt that succeeded.
* :func:`subscribe_guarded` — registers an ``@idempotent_consumer`` handler on a ``PushConsumer``. The
  wrapper's own ``subscribe`` re-raises a callback's exception out of the ctypes callback, where the C side
  sees an undefined return value (``rocketmq-reference.md`` lists it as unverified); a guard must never risk
  an accidental ack, so this module registers its own C callback that always *returns* the status and
  never raises. ``DEAD_LETTER`` cannot be expressed through 0.4.4 (no ``delayLevelWhenNextConsume``): it
  is answered ``RECONSUME_LATER``, so the broker moves the message to ``%DLQ%{group}`` after
  ``maxReconsumeTimes``; the guard has already journaled the reason. Pass ``dead_letter=`` to publish a copy
  somewhere yourself and acknowledge at once instead.

Envelope mapping: ``message_id`` = first token of the message *keys*, else the client message id
(UNIQ_KEY); ``topic`` = the original topic (the C++ client puts ``RETRY_TOPIC`` back as the topic of a
``%RETRY%`` delivery); ``delivered_topic`` = ``%RETRY%{group}`` when the copy came from the group's retry
topic (it carries ``RETRY_TOPIC``), else ``None``; ``queue_id``/``queue_offset`` = the position of this copy
in the delivered topic, so the guard raises that queue's watermark only; ``broker_name`` = the broker group
when the route has that queue id on one group only (0.4.4 exposes neither brokerName nor the store host —
the message ``id`` is the client's UNIQ_KEY — see :class:`QueueBook`), else ``""``; ``reconsume_times`` as
delivered.
The 0.4.4 wrapper reads bodies as C strings, so bodies must not contain NUL bytes (JSON, text: fine).

Targeted resends and the loss probe: :class:`RocketMQSender` sends a message with
``OutgoingMessage.target_group`` to ``%RETRY%{group}`` with ``RETRY_TOPIC`` = the topic (only that group
consumes it), and is the sweeper's :class:`~reliable.sender.BrokerProbe` through :class:`RocketMQProbe`:
GET_MAX_OFFSET over RocketMQ's remoting protocol (the 0.4.4 client has no call for it), spoken by
broker_sim's wire client (``broker_sim.remoting``), which resolves the broker through the name server.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from reliable import constants as C
from reliable.adapters.aio_bridge import LoopBridge, is_async_handler
from reliable.adapters.broker_sim import BrokerSimProbe
from reliable.errors import ConfigurationError, SendError
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.types import ConsumeResult, Envelope

log = logging.getLogger("reliable.adapters.rocketmq")

RETRY_PREFIX = "%RETRY%"
RETRY_TOPIC_PROPERTY = "RETRY_TOPIC"
_PERM_WRITE = 2  # RocketMQ PermName.PERM_WRITE


def _client() -> Any:
    try:
        import rocketmq.client as client
    except (ImportError, OSError) as exc:  # OSError: the bundled librocketmq.so failed to load
        raise ConfigurationError(f"the RocketMQ adapter needs the 'rocketmq' package: {exc}") from exc
    return client


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def retry_topic(group: str) -> str:
    """``%RETRY%{group}``: the topic a group's retries (and the sweeper's targeted resends) live on."""
    return RETRY_PREFIX + group


class RocketMQProbe(BrokerSimProbe):
    """A :class:`~reliable.sender.BrokerProbe`: a queue's max offset (GET_MAX_OFFSET; and its min offset,
    GET_MIN_OFFSET, the :class:`~reliable.sender.RetentionProbe`) via the name server
    ``namesrv``, over broker_sim's RocketMQ 4.x wire client, asked of the queue's broker group; ``None`` when
    the broker cannot tell. It also reads topic routes for :class:`QueueBook`."""

    def __init__(self, namesrv: str, timeout_ms: int = 3000) -> None:
        from broker_sim.remoting.client_transport import RemotingTransport

        super().__init__(RemotingTransport(namesrv, request_timeout_ms=timeout_ms))
        self.queues = QueueBook(self.transport.get_route)

    def close(self) -> None:
        self.transport.close()


class QueueBook:
    """The broker group of a queue, derived from the name server's topic route (0.4.4 tells neither).

    Sending: the C++ client's ``send_orderly`` hands our selector an index into its publish list, which it
    builds from the route the way this class does: in the order of the route's ``orderTopicConf``
    (``"broker-b:2;broker-a:2"``, set by a name server's ORDER_TOPIC_CONFIG) when it has one, else from the
    queue data sorted by broker name whatever order the name server sent it in (writable groups that have
    a master; queues ``0 … writeQueueNums-1`` of each). The list is rebuilt here and used only when its
    length equals the size the client passed; otherwise the route is read again once, and if it still
    differs the send's broker group is recorded as unknown (``""``, queue id = the index).

    Consuming: a delivery carries topic, queue id and offsets but no broker name and no store host (its
    ``id`` is the client's UNIQ_KEY). The group is named only when exactly one broker group of the route has
    that queue id; otherwise it stays ``""`` and the sweeper treats that group's watermark as unknown for
    copies on named queues (no overtaken verdict; the broker probe still proves a loss).
    """

    def __init__(self, route: Callable[[str], Any], ttl_s: float = C.ROUTE_CACHE_TTL_S) -> None:
        self._route = route
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, Any]] = {}

    def _get(self, topic: str, fresh: bool = False) -> Any:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(topic)
        if hit is not None and not fresh and now - hit[0] < self._ttl_s:
            return hit[1]
        route = self._route(topic)
        with self._lock:
            self._cache[topic] = (now, route)
        return route

    @staticmethod
    def publish_list(route: Any) -> list[tuple[str, int]]:
        """(broker name, queue id) in the order of the C++ client's publish list."""
        out: list[tuple[str, int]] = []
        if route.order_topic_conf:  # the client takes this order as it is (no permission or master check)
            for entry in route.order_topic_conf.split(";"):
                name, _, nums = entry.partition(":")
                if name and nums.strip().isdigit():
                    out.extend((name, i) for i in range(int(nums)))
            return out
        masters = {b.broker_name for b in route.broker_datas if 0 in b.broker_addrs}
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            if qd.perm & _PERM_WRITE and qd.broker_name in masters:
                out.extend((qd.broker_name, i) for i in range(qd.write_queue_nums))
        return out

    def sent_to(self, topic: str, index: int, size: int) -> tuple[str, int]:
        """(broker name, queue id) of the queue at ``index`` of the client's list of ``size`` queues."""
        for fresh in (False, True):
            try:
                mqs = self.publish_list(self._get(topic, fresh))
            except Exception as exc:  # no route: the position is recorded without its group
                log.warning("route of %s unknown: %r; send recorded without broker group", topic, exc)
                return "", index
            if len(mqs) == size:
                return mqs[index]
        log.warning("route of %s differs from the client's (%d queues): broker group unknown", topic, size)
        return "", index

    def owner(self, topic: str, queue_id: int) -> str:
        """The one broker group whose route has ``queue_id`` of ``topic``; ``""``: several, or unknown."""
        try:
            route = self._get(topic)
        except Exception as exc:
            log.debug("route of %s unknown: %r", topic, exc)
            return ""
        names = {qd.broker_name for qd in route.queue_datas if qd.read_queue_nums > queue_id}
        return names.pop() if len(names) == 1 else ""


class RocketMQSender:
    """A :class:`~reliable.sender.Sender` over a started ``rocketmq.client.Producer`` (one broker), and the
    sweeper's :class:`~reliable.sender.BrokerProbe` when given a ``probe``."""

    #: names and body size the broker accepts (checked by the producer at staging time)
    name_pattern = C.ROCKETMQ_NAME_PATTERN
    max_body_bytes = C.ROCKETMQ_MAX_BODY_BYTES

    def __init__(self, producer: Any, retry_times: int = 2, probe: RocketMQProbe | None = None) -> None:
        self.producer = producer
        self.retry_times = retry_times
        self.probe = probe
        self._next = itertools.count()
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, namesrv: str, group: str, timeout_ms: int = 3000) -> RocketMQSender:
        """Create and start a producer of ``group`` against the name server ``namesrv`` ("host:port"), with
        a probe on the same name server."""
        client = _client()
        producer = client.Producer(group, timeout=timeout_ms)
        producer.set_namesrv_addr(namesrv)
        producer.start()
        return cls(producer, probe=RocketMQProbe(namesrv, timeout_ms))

    def close(self) -> None:
        self.producer.shutdown()
        if self.probe is not None:
            self.probe.close()

    def resend_topic(self, topic: str, group: str) -> str:
        """Where a resend targeted at ``group`` lands (the sweeper compares its offset there)."""
        return retry_topic(group)

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return None if self.probe is None else self.probe.max_offset(topic, queue_id, broker_name)

    def min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return None if self.probe is None else self.probe.min_offset(topic, queue_id, broker_name)

    def _message(self, message: OutgoingMessage) -> Any:
        client = _client()
        targeted = message.target_group is not None
        msg = client.Message(retry_topic(message.target_group) if message.target_group else message.topic)
        msg.set_keys(message.message_id)
        if message.tags:
            msg.set_tags(message.tags)
        msg.set_body(message.body)
        for key, value in message.properties.items():
            msg.set_property(key, value)
        if targeted:
            msg.set_property(RETRY_TOPIC_PROPERTY, message.topic)
        return msg

    def _attempt(self, msg: Any, turn: int) -> tuple[Any, tuple[int, int] | None]:
        """One send through the selector (index ``turn``), no retry by the client: (result, (index, size))."""
        chosen: list[tuple[int, int]] = []

        def round_robin(mq_size: int, _msg: Any, _arg: Any) -> int:
            index = turn % mq_size
            chosen.append((index, mq_size))
            return index

        result = self.producer.send_orderly(msg, 0, retry_times=0, queue_selector=round_robin)
        return result, (chosen[-1] if chosen else None)

    def send(self, message: OutgoingMessage) -> SendReceipt:
        with self._lock:
            turn = next(self._next)
        msg = self._message(message)
        for attempt in range(max(0, self.retry_times) + 1):
            try:
                result, chosen = self._attempt(msg, turn + attempt)
                break
            except Exception as exc:
                if attempt >= self.retry_times:
                    raise SendError(
                        f"RocketMQ send of {message.message_id} failed: {type(exc).__name__}: {exc}"
                    ) from exc
                log.warning("send of %s failed (%r); retrying on the next queue", message.message_id, exc)
        if chosen is None:
            raise SendError(f"RocketMQ send of {message.message_id}: the client never selected a queue")
        status = getattr(result.status, "name", str(result.status))
        if status != "OK":
            log.warning("message %s stored with status %s", message.message_id, status)
        index, size = chosen
        broker, queue_id = "", index  # one broker without a probe: the index is the queue id
        if self.probe is not None:
            topic = retry_topic(message.target_group) if message.target_group else message.topic
            broker, queue_id = self.probe.queues.sent_to(topic, index, size)
        return SendReceipt(
            queue_id=queue_id,
            queue_offset=int(result.offset),
            broker_message_id=result.msg_id,
            broker_name=broker,
        )


def sweeper_sender(rel: object) -> RocketMQSender:
    """``reliable sweep --sender reliable.adapters.rocketmq:sweeper_sender``: a sender to the name server in
    ``RELIABLE_ROCKETMQ_NAMESRV`` (default 127.0.0.1:9876), producer group ``RELIABLE_SENDER_GROUP``
    (default ``reliable_sweeper``)."""
    namesrv = os.environ.get(C.ENV_ROCKETMQ_NAMESRV) or C.DEFAULT_NAMESRV
    group = os.environ.get(C.ENV_SENDER_GROUP) or C.DEFAULT_SENDER_GROUP
    return RocketMQSender.connect(namesrv, group)


def to_envelope(
    msg: Any,
    group: str | None = None,
    queues: QueueBook | None = None,
    max_reconsume_times: int | None = None,
) -> Envelope:
    """A ``rocketmq.client.RecvMessage`` as an :class:`~reliable.types.Envelope`; ``group`` is the consuming
    group (it names the delivered topic of a ``%RETRY%`` delivery); ``queues`` names the broker group where
    the route makes it unambiguous (:class:`QueueBook`), else ``broker_name`` stays ``""``;
    ``max_reconsume_times`` marks the broker's last delivery (``last_attempt``)."""
    keys = _text(msg.keys) or None
    tokens = keys.split() if keys else []
    message_id = tokens[0] if tokens else (_text(msg.id) or None)
    body = msg.body
    topic = _text(msg.topic) or ""
    original = _text(msg.get_property(RETRY_TOPIC_PROPERTY)) or None
    delivered: str | None = None
    if topic.startswith(RETRY_PREFIX):
        delivered, topic = topic, original or topic
    elif original:
        if group is None:
            raise ValueError(f"message {message_id} is a %RETRY% delivery: its consumer group is needed")
        delivered = retry_topic(group)
    return Envelope(
        message_id=message_id,
        topic=topic,
        queue_id=int(msg.queue_id),
        queue_offset=int(msg.queue_offset),
        body=body if isinstance(body, bytes) else str(body).encode(),
        keys=keys,
        tags=_text(msg.tags) or None,
        reconsume_times=int(msg.reconsume_times),
        delivered_topic=delivered,
        broker_name="" if queues is None else queues.owner(delivered or topic, int(msg.queue_id)),
        last_attempt=max_reconsume_times is not None and int(msg.reconsume_times) >= max_reconsume_times,
    )


DeadLetterFn = Callable[[Envelope], None]


def consume_status(
    handler: Callable[[Envelope], Any], env: Envelope, dead_letter: DeadLetterFn | None = None
) -> int:
    """The C status (0 = CONSUME_SUCCESS, 1 = RECONSUME_LATER) for one delivery; never raises."""
    try:
        result = handler(env)
    except Exception:
        log.exception("handler raised on message %s; reconsume later", env.message_id)
        return 1
    if not isinstance(result, ConsumeResult):  # e.g. the coroutine of an async handler nobody awaits
        if inspect.iscoroutine(result):
            result.close()
        log.error(
            "handler answered %r on message %s, not a ConsumeResult; reconsume later", result, env.message_id
        )
        return 1
    if result is ConsumeResult.SUCCESS:
        return 0
    if result is ConsumeResult.DEAD_LETTER and dead_letter is not None:
        try:
            dead_letter(env)
            return 0
        except Exception:
            log.exception("dead-letter action failed for %s; reconsume later", env.message_id)
    return 1


def subscribe_guarded(
    consumer: Any,
    topic: str,
    handler: Callable[[Envelope], Any],
    expression: str = "*",
    dead_letter: DeadLetterFn | None = None,
    group: str | None = None,
    queues: QueueBook | None = None,
    max_reconsume_times: int | None = C.ROCKETMQ_MAX_RECONSUME_TIMES,
    loop: asyncio.AbstractEventLoop | None = None,
) -> LoopBridge | None:
    """Subscribe ``consumer`` (a ``rocketmq.client.PushConsumer``, not started) to ``topic`` with ``handler``.

    ``handler`` is what ``@idempotent_consumer`` returns; ``group`` is the consumer's group (default:
    ``handler.group``); ``queues`` (e.g. ``RocketMQProbe(namesrv).queues``) names the broker group of a
    delivery where the route makes it unambiguous. Must be called once per consumer (0.4.4 has one callback
    per consumer). ``max_reconsume_times`` is the group's ``retryMaxTimes`` on the broker (16 by default;
    0.4.4 sends no limit of its own with a failed delivery, so the group's decides): a delivery at that
    limit is the broker's last (``last_attempt``), so a handler failure there ends the group's row ``DEAD``
    with the guard's reason even below ``max_attempts``. Pass the group's value if it was changed.

    An ``async def`` guarded handler runs on ``loop`` (one the caller runs on another thread) or on a loop
    thread of its own (:class:`~reliable.adapters.aio_bridge.LoopBridge`), the client's consume thread
    waiting for the guard's answer; the bridge is returned (``None`` for a sync handler): close it after
    ``consumer.shutdown()``.
    """
    client = _client()
    handler_group = getattr(handler, "group", None)
    group = group or (handler_group if isinstance(handler_group, str) else None)
    bridge = LoopBridge(handler, loop) if is_async_handler(handler) else None
    sync_handler: Callable[[Envelope], Any] = handler if bridge is None else bridge
    from rocketmq.exceptions import ffi_check
    from rocketmq.ffi import dll

    def on_message(_consumer: Any, handle: Any) -> int:
        try:
            env = to_envelope(client.RecvMessage(handle), group, queues, max_reconsume_times)
        except Exception:
            log.exception("undecodable RocketMQ delivery; reconsume later")
            return 1
        return consume_status(sync_handler, env, dead_letter)

    ffi_check(dll.Subscribe(consumer._handle, topic.encode(), expression.encode()))
    consumer._register_callback(on_message)
    return bridge


def push_consumer(namesrv: str, group: str, thread_count: int | None = None) -> Any:
    """A clustering ``rocketmq.client.PushConsumer`` of ``group`` on ``namesrv`` (not started)."""
    client = _client()
    consumer = client.PushConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    if thread_count is not None:
        consumer.set_thread_count(thread_count)
    return consumer
