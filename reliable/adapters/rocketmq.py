"""RocketMQ 4.x adapter for the official Python client (PyPI ``rocketmq`` 0.4.4, the C++ client via ctypes).

Two parts, both tested against ``broker-sim serve`` (tests/adapters/test_rocketmq_adapter.py):

* :class:`RocketMQSender` — the :class:`~reliable.sender.Sender` of the stub-first producer and the sweeper.
  The 0.4.4 ``SendResult`` carries ``(status, msg_id, offset)`` but no queue id, and the sweeper needs the
  queue to compare the offset with the right watermark. So the sender picks the queue itself through
  ``send_orderly`` with a round-robin selector and records the index it chose: with one broker (the only
  layout this adapter supports) the C++ client's queue list is sorted by queue id, so the index *is* the
  queue id. ``send_orderly`` does not move to another queue on failure (``retry_times`` retries the same
  queue), which is what the receipt needs: the offset belongs to the queue we recorded.
* :func:`subscribe_guarded` — registers an ``@idempotent_consumer`` handler on a ``PushConsumer``. The
  wrapper's own ``subscribe`` re-raises a callback's exception out of the ctypes callback, where the C side
  sees an undefined return value (``rocketmq-reference.md`` lists it as unverified); a guard must never risk
  an accidental ack, so this module registers its own C callback that always *returns* the status and
  never raises. ``DEAD_LETTER`` cannot be expressed through 0.4.4 (no ``delayLevelWhenNextConsume``): it
  is answered ``RECONSUME_LATER``, so the broker moves the message to ``%DLQ%{group}`` after
  ``maxReconsumeTimes``; the guard has already journaled the reason. Pass ``dead_letter=`` to publish a copy
  somewhere yourself and acknowledge at once instead.

Envelope mapping: ``message_id`` = first token of the message *keys*, else the client message id
(UNIQ_KEY); topic = the message's topic (the C++ client restores the original topic of a retry);
``queue_id``/``queue_offset``/``reconsume_times`` as delivered. The 0.4.4 wrapper reads bodies as C strings,
so bodies must not contain NUL bytes (JSON, text: fine).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from reliable import constants as C
from reliable.errors import ConfigurationError, SendError
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.types import ConsumeResult, Envelope

log = logging.getLogger("reliable.adapters.rocketmq")


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


class RocketMQSender:
    """A :class:`~reliable.sender.Sender` over a started ``rocketmq.client.Producer`` (one broker)."""

    def __init__(self, producer: Any, retry_times: int = 2) -> None:
        self.producer = producer
        self.retry_times = retry_times
        self._next = itertools.count()
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, namesrv: str, group: str, timeout_ms: int = 3000) -> RocketMQSender:
        """Create and start a producer of ``group`` against the name server ``namesrv`` ("host:port")."""
        client = _client()
        producer = client.Producer(group, timeout=timeout_ms)
        producer.set_namesrv_addr(namesrv)
        producer.start()
        return cls(producer)

    def close(self) -> None:
        self.producer.shutdown()

    def _message(self, message: OutgoingMessage) -> Any:
        client = _client()
        msg = client.Message(message.topic)
        msg.set_keys(message.message_id)
        if message.tags:
            msg.set_tags(message.tags)
        msg.set_body(message.body)
        for key, value in message.properties.items():
            msg.set_property(key, value)
        return msg

    def send(self, message: OutgoingMessage) -> SendReceipt:
        with self._lock:
            turn = next(self._next)
        chosen: list[int] = []

        def round_robin(mq_size: int, _msg: Any, _arg: Any) -> int:
            index = turn % mq_size
            chosen.append(index)
            return index

        try:
            result = self.producer.send_orderly(
                self._message(message), 0, retry_times=self.retry_times, queue_selector=round_robin
            )
        except Exception as exc:
            raise SendError(
                f"RocketMQ send of {message.message_id} failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not chosen:
            raise SendError(f"RocketMQ send of {message.message_id}: the client never selected a queue")
        status = getattr(result.status, "name", str(result.status))
        if status != "OK":
            log.warning("message %s stored with status %s", message.message_id, status)
        return SendReceipt(
            queue_id=chosen[-1], queue_offset=int(result.offset), broker_message_id=result.msg_id
        )


def sweeper_sender(rel: object) -> RocketMQSender:
    """``reliable sweep --sender reliable.adapters.rocketmq:sweeper_sender``: a sender to the name server in
    ``RELIABLE_ROCKETMQ_NAMESRV`` (default 127.0.0.1:9876), producer group ``RELIABLE_SENDER_GROUP``
    (default ``reliable_sweeper``)."""
    namesrv = os.environ.get(C.ENV_ROCKETMQ_NAMESRV) or C.DEFAULT_NAMESRV
    group = os.environ.get(C.ENV_SENDER_GROUP) or C.DEFAULT_SENDER_GROUP
    return RocketMQSender.connect(namesrv, group)


def to_envelope(msg: Any) -> Envelope:
    """A ``rocketmq.client.RecvMessage`` as an :class:`~reliable.types.Envelope`."""
    keys = _text(msg.keys) or None
    tokens = keys.split() if keys else []
    message_id = tokens[0] if tokens else (_text(msg.id) or None)
    body = msg.body
    return Envelope(
        message_id=message_id,
        topic=_text(msg.topic) or "",
        queue_id=int(msg.queue_id),
        queue_offset=int(msg.queue_offset),
        body=body if isinstance(body, bytes) else str(body).encode(),
        keys=keys,
        tags=_text(msg.tags) or None,
        reconsume_times=int(msg.reconsume_times),
    )


DeadLetterFn = Callable[[Envelope], None]


def consume_status(
    handler: Callable[[Envelope], ConsumeResult], env: Envelope, dead_letter: DeadLetterFn | None = None
) -> int:
    """The C status (0 = CONSUME_SUCCESS, 1 = RECONSUME_LATER) for one delivery; never raises."""
    try:
        result = handler(env)
    except Exception:
        log.exception("handler raised on message %s; reconsume later", env.message_id)
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
    handler: Callable[[Envelope], ConsumeResult],
    expression: str = "*",
    dead_letter: DeadLetterFn | None = None,
) -> None:
    """Subscribe ``consumer`` (a ``rocketmq.client.PushConsumer``, not started) to ``topic`` with ``handler``.

    ``handler`` is what ``@idempotent_consumer`` returns. Must be called once per consumer (0.4.4 has one
    callback per consumer).
    """
    client = _client()
    from rocketmq.exceptions import ffi_check
    from rocketmq.ffi import dll

    def on_message(_consumer: Any, handle: Any) -> int:
        try:
            env = to_envelope(client.RecvMessage(handle))
        except Exception:
            log.exception("undecodable RocketMQ delivery; reconsume later")
            return 1
        return consume_status(handler, env, dead_letter)

    ffi_check(dll.Subscribe(consumer._handle, topic.encode(), expression.encode()))
    consumer._register_callback(on_message)


def push_consumer(namesrv: str, group: str, thread_count: int | None = None) -> Any:
    """A clustering ``rocketmq.client.PushConsumer`` of ``group`` on ``namesrv`` (not started)."""
    client = _client()
    consumer = client.PushConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    if thread_count is not None:
        consumer.set_thread_count(thread_count)
    return consumer
