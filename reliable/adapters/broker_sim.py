"""broker_sim adapter: a :class:`~reliable.sender.Sender` over a broker_sim ``Producer`` and a listener
wrapper that puts ``@idempotent_consumer`` handlers behind a broker_sim ``PushConsumer``.

The sending side (:class:`BrokerSimSender`, the sweeper's probe) lives in
:mod:`reliable.adapters.broker_sim_send` (re-exported here). Works with both broker_sim clients, because
both take the same first argument: a ``Broker`` object (in-process) or ``"host:port"`` of
``broker-sim serve``'s name server (TCP).

Mapping of a delivery to an :class:`~reliable.types.Envelope`:

* ``message_id`` — the first token of the message *keys* (the producer and the sweeper put the stub's id
  there, RocketMQ's recommended practice), else the client ``UNIQ_KEY`` (a producer that does not use stubs:
  RocketMQ keeps the UNIQ_KEY across its own send retries, so it still identifies the message). No id at all
  becomes ``None``, which the guard dead-letters as bad input.
* ``topic`` — the message's original (business) topic. Retries, and the sweeper's targeted resends, arrive
  from ``%RETRY%{group}`` with the original topic in ``RETRY_TOPIC``; the push consumer has already put that
  back as the message's topic (listeners never see ``%RETRY%``), so ``RETRY_TOPIC`` is how we know.
* ``delivered_topic`` — where this copy was actually stored: ``%RETRY%{group}`` for such a delivery (the
  group comes from the guarded handler, ``handler.group``), ``None`` for a delivery from the topic itself.
* ``broker_name`` — the broker group the copy was pulled from (``MessageExt.broker_name``): with
  ``queue_id`` it names the queue, since each group of a cluster has its own queue 0.
* ``queue_id``/``queue_offset`` — the position of this copy *in the delivered topic*. The guard journals
  it and raises the watermark of that queue only, so a retry never moves the watermark of an unrelated
  queue of the original topic (which would make the sweeper re-send messages merely queued there).

Sending: :class:`BrokerSimSender` honours ``OutgoingMessage.target_group`` — the sweeper's resend for one
group goes to ``%RETRY%{group}`` with ``RETRY_TOPIC`` = the topic, so only that group receives it (every
clustering consumer subscribes to its retry topic); its receipt names the broker group the send landed on.
It is also the sweeper's :class:`~reliable.sender.BrokerProbe`: the max offset (GET_MAX_OFFSET) of the
queue, asked of that queue's broker group, proves a loss.

Mapping of :class:`~reliable.types.ConsumeResult` back to the broker: ``SUCCESS`` → ``CONSUME_SUCCESS``;
``RECONSUME_LATER`` → ``RECONSUME_LATER`` (the broker's ``%RETRY%`` path with its delay levels);
``DEAD_LETTER`` → the adapter sends that message back with delay level ``-1`` (RocketMQ's "to the DLQ now",
see ``rocketmq-reference.md`` §C) and acknowledges it, so a poison message does not go through 16 retries
first. When that send-back fails the message is answered ``RECONSUME_LATER`` instead: never a silent ack.
In a batch, a message answered ``RECONSUME_LATER`` beside others that were settled is sent back alone
(delay level 0: the broker's next retry level) and the batch acknowledged; answering the batch
``RECONSUME_LATER`` sent *every* message back — the applied ones became duplicates, and a dead-lettered one
went to the DLQ again at its next delivery.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from broker_sim.broker.api import ConsumerSendMsgBackRequest
from broker_sim.client.message import ConsumeStatus, MessageExt, Prop
from broker_sim.client.transport import BrokerTransport
from reliable import constants as C
from reliable.adapters.aio_bridge import LoopBridge, is_async_handler
from reliable.adapters.broker_sim_send import (
    PROBE_WARNINGS,
    RETRY_PREFIX,
    BrokerSimProbe,
    BrokerSimSender,
    ProbeWarnings,
    retry_topic,
    sweeper_sender,
    to_message,
)
from reliable.types import ConsumeResult, Envelope

log = logging.getLogger("reliable.adapters.broker_sim")

__all__ = [
    "PROBE_WARNINGS",
    "RETRY_PREFIX",
    "BrokerSimProbe",
    "BrokerSimSender",
    "GuardedListener",
    "ListenerStats",
    "ProbeWarnings",
    "SendBack",
    "delivered_topic_of",
    "message_id_of",
    "retry_topic",
    "send_back_to_dlq",
    "sweeper_sender",
    "to_envelope",
    "to_message",
]


def message_id_of(msg: MessageExt) -> str | None:
    """The business id of a delivery: first KEYS token, else UNIQ_KEY, else ``None``."""
    keys = msg.properties.get(Prop.KEYS, "").split()
    if keys:
        return keys[0]
    return msg.properties.get(Prop.UNIQ_KEY) or None


def delivered_topic_of(msg: MessageExt, group: str | None) -> str | None:
    """The topic this copy was stored on when it is not the message's own topic (a ``%RETRY%`` delivery).

    A pull consumer sees ``%RETRY%{group}`` itself; the push consumer has already restored the original topic
    and left ``RETRY_TOPIC`` (which only messages stored on a retry topic carry): the copy came from the
    consuming group's retry topic.
    """
    if msg.topic.startswith(RETRY_PREFIX):
        return msg.topic
    if msg.properties.get(Prop.RETRY_TOPIC):
        if group is None:
            raise ValueError(
                f"message {msg.msg_id} is a %RETRY% delivery: its consumer group is needed to name the "
                "delivered topic (GuardedListener(group=...) or a handler with .group)"
            )
        return retry_topic(group)
    return None


def to_envelope(
    msg: MessageExt, group: str | None = None, max_reconsume_times: int | None = None
) -> Envelope:
    """The broker-neutral view of one broker_sim delivery (see the module docstring for the mapping);
    ``group`` is the consuming group (needed for ``%RETRY%`` deliveries); ``max_reconsume_times``, the
    consumer's, marks the broker's last delivery (``last_attempt``)."""
    delivered = delivered_topic_of(msg, group)
    topic = msg.properties.get(Prop.RETRY_TOPIC, msg.topic) if delivered else msg.topic
    keys = msg.properties.get(Prop.KEYS) or None
    return Envelope(
        message_id=message_id_of(msg),
        topic=topic,
        queue_id=int(msg.queue_id),
        queue_offset=int(msg.queue_offset),
        body=bytes(msg.body),
        keys=keys,
        tags=msg.properties.get(Prop.TAGS) or None,
        reconsume_times=int(msg.reconsume_times),
        properties=dict(msg.properties),
        delivered_topic=delivered,
        broker_name=msg.broker_name or "",
        last_attempt=max_reconsume_times is not None and int(msg.reconsume_times) >= max_reconsume_times,
    )


DeadLetterFn = Callable[[MessageExt], None]


def _checked(results: list[Any]) -> list[ConsumeResult]:
    """The handler's answers, each a :class:`ConsumeResult`; anything else (a coroutine nobody awaited) is a
    listener error — the broker retries the batch — rather than a silent ``RECONSUME_LATER`` for ever."""
    for result in results:
        if not isinstance(result, ConsumeResult):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError(f"the guarded handler answered {result!r}, not a ConsumeResult")
    return results


class SendBack:
    """CONSUMER_SEND_MSG_BACK for one group, to the broker group that stored the message. Called, it is the
    dead-letter action (delay level -1: the broker moves the message to ``%DLQ%{group}``); :meth:`retry`
    hands one message back for redelivery (delay level 0: the broker's next retry level)."""

    def __init__(self, transport: BrokerTransport, group: str) -> None:
        self.transport = transport
        self.group = group

    def __call__(self, msg: MessageExt) -> None:
        self._send(msg, -1)

    def retry(self, msg: MessageExt, max_reconsume_times: int | None) -> None:
        self._send(msg, 0, max_reconsume_times)

    def _send(self, msg: MessageExt, delay_level: int, max_reconsume_times: int | None = None) -> None:
        self.transport.consumer_send_msg_back(
            ConsumerSendMsgBackRequest(
                group=self.group,
                offset=msg.commit_log_offset,
                delay_level=delay_level,
                origin_msg_id=msg.msg_id,
                origin_topic=msg.properties.get(Prop.RETRY_TOPIC, msg.topic),
                max_reconsume_times=max_reconsume_times,
                broker_name=msg.broker_name or "",  # the group that stored it (several in a cluster)
            )
        )


def send_back_to_dlq(transport: BrokerTransport, group: str) -> DeadLetterFn:
    """The dead-letter action of :class:`GuardedListener` (a :class:`SendBack`, which also lets the listener
    send one message of a batch back for retry alone)."""
    return SendBack(transport, group)


@dataclass
class ListenerStats:
    """What the listener decided, for logs and the demo's counters (this process only)."""

    delivered: int = 0
    success: int = 0
    reconsume_later: int = 0
    dead_lettered: int = 0


class GuardedListener:
    """A broker_sim concurrent listener (``listener(msgs) -> ConsumeStatus``) around a guarded handler.

    ``handler`` is what ``@idempotent_consumer`` returns: ``handler(envelope) -> ConsumeResult``, with
    ``handler.batch(envelopes)`` used for batches of more than one message. ``group`` is the consumer
    group (default: ``handler.group``); it names the delivered topic of ``%RETRY%`` deliveries. The batch
    is acknowledged once every message that needs a retry has been sent back alone (:class:`SendBack`);
    when that cannot be done it is answered ``RECONSUME_LATER`` (broker_sim then sends every message of the
    batch back; the guard turns the already-applied ones into duplicates). An exception from the handler
    propagates: broker_sim treats a raising listener as ``RECONSUME_LATER``, never as an ack.

    ``max_reconsume_times`` is the consumer's (``PushConsumer(max_reconsume_times=…)``, 16 by default): a
    delivery at that limit is the broker's last (``Envelope.last_attempt``), so a handler failure there
    ends the group's row ``DEAD`` with the guard's reason even below the guard's ``max_attempts``. Keep the
    two equal; ``None`` marks nothing.

    An ``async def`` guarded handler runs on ``loop`` (a loop the caller runs on another thread), or on a
    loop thread of the listener's own (:class:`~reliable.adapters.aio_bridge.LoopBridge`), each consume
    thread waiting for the guard's answer; :meth:`close` stops that loop after the consumer's shutdown.
    """

    def __init__(
        self,
        handler: Callable[[Envelope], Any],
        dead_letter: DeadLetterFn | None = None,
        *,
        batch: bool = True,
        group: str | None = None,
        max_reconsume_times: int | None = C.ROCKETMQ_MAX_RECONSUME_TIMES,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.bridge: LoopBridge | None = None
        if is_async_handler(handler):
            self.bridge = LoopBridge(handler, loop)
            handler = self.bridge
        self.handler: Callable[[Envelope], ConsumeResult] = handler
        self.max_reconsume_times = max_reconsume_times
        self.dead_letter = dead_letter
        handler_group = getattr(handler, "group", None)
        self.group = group or (handler_group if isinstance(handler_group, str) else None)
        #: use the handler's ``batch(envs)`` (one journal and one work transaction per batch) when it has one
        self.batch_handler: Callable[[Sequence[Envelope]], list[ConsumeResult]] | None = (
            getattr(handler, "batch", None) if batch else None
        )
        self.stats = ListenerStats()

    def _results(self, msgs: Sequence[MessageExt]) -> list[ConsumeResult]:
        envs = [to_envelope(m, self.group, self.max_reconsume_times) for m in msgs]
        if self.batch_handler is not None and len(envs) > 1:
            results = list(self.batch_handler(envs))
            if len(results) != len(envs):
                raise ValueError(f"batch handler returned {len(results)} results for {len(envs)} messages")
            return _checked(results)
        return _checked([self.handler(env) for env in envs])

    def close(self, grace_s: float | None = C.BRIDGE_CLOSE_GRACE_S) -> None:
        """Stop the loop thread of an ``async def`` handler's bridge (after the consumer's shutdown), once the
        guard calls still running have answered (up to ``grace_s``: :meth:`LoopBridge.close`)."""
        if self.bridge is not None:
            self.bridge.close(grace_s)

    def __call__(self, msgs: Sequence[MessageExt], *context: Any) -> ConsumeStatus:
        later: list[MessageExt] = []
        for msg, result in zip(msgs, self._results(msgs), strict=True):
            self.stats.delivered += 1
            if result is ConsumeResult.SUCCESS:
                self.stats.success += 1
            elif result is ConsumeResult.DEAD_LETTER and self._dead_letter(msg):
                self.stats.dead_lettered += 1
            else:
                self.stats.reconsume_later += 1
                later.append(msg)
        if not later or (len(later) < len(msgs) and self._retry_alone(later)):
            return ConsumeStatus.CONSUME_SUCCESS
        return ConsumeStatus.RECONSUME_LATER

    def _retry_alone(self, msgs: Sequence[MessageExt]) -> bool:
        """Send ``msgs`` back for redelivery one by one, so the rest of their batch is acknowledged; False
        (the batch is then answered RECONSUME_LATER, every message sent back by the consumer) when the
        dead-letter action cannot do it or a send-back fails — a message sent back twice is a duplicate the
        guard absorbs, one acknowledged without being sent back would be lost."""
        retry = getattr(self.dead_letter, "retry", None)
        if not callable(retry):
            return False
        try:
            for msg in msgs:
                retry(msg, self.max_reconsume_times)
        except Exception:
            log.warning(
                "send-back of one message for retry failed; the whole batch is retried", exc_info=True
            )
            return False
        return True

    def _dead_letter(self, msg: MessageExt) -> bool:
        if self.dead_letter is None:
            log.warning("message %s: DEAD_LETTER without a dead-letter action; retried instead", msg.msg_id)
            return False
        try:
            self.dead_letter(msg)
        except Exception:
            log.exception("message %s: send-back to the DLQ failed; retried instead", msg.msg_id)
            return False
        return True
