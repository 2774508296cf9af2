"""broker_sim adapter: a :class:`~reliable.sender.Sender` over a broker_sim ``Producer`` and a listener
wrapper that puts ``@idempotent_consumer`` handlers behind a broker_sim ``PushConsumer``.

Works with both broker_sim clients, because both take the same first argument: a ``Broker`` object
(in-process) or ``"host:port"`` of ``broker-sim serve``'s name server (TCP).

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
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from broker_sim.broker.api import ConsumerSendMsgBackRequest
from broker_sim.client.message import ConsumeStatus, Message, MessageExt, Prop, SendStatus
from broker_sim.client.transport import BrokerTransport
from reliable import constants as C
from reliable.errors import SendError
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.sweeper import metrics as sweeper_metrics
from reliable.types import ConsumeResult, Envelope

log = logging.getLogger("reliable.adapters.broker_sim")

RETRY_PREFIX = "%RETRY%"


class _BrokerSimProducer(Protocol):
    def send(self, msg: Message) -> Any: ...


def retry_topic(group: str) -> str:
    """``%RETRY%{group}``: the topic a group's retries (and the sweeper's targeted resends) live on."""
    return RETRY_PREFIX + group


def to_message(message: OutgoingMessage) -> Message:
    """The broker_sim message for an outgoing stub: the stub id travels as the message *keys*; a targeted
    send goes to the group's retry topic with the original topic in ``RETRY_TOPIC``."""
    props = dict(message.properties)
    topic = message.topic
    if message.target_group is not None:
        topic = retry_topic(message.target_group)
        props[Prop.RETRY_TOPIC] = message.topic
    return Message(
        topic=topic,
        body=message.body,
        keys=message.message_id,
        tags=message.tags,
        properties=props,
    )


class BrokerSimSender:
    """A :class:`~reliable.sender.Sender` over a started broker_sim ``Producer``.

    The receipt carries the queue id and offset the broker assigned, which the sweeper compares with the
    consumer's watermark. Any failure (including broker_sim's send timeout, after which the message may or
    may not be stored) raises :class:`~reliable.errors.SendError`, leaving the stub PENDING.
    """

    #: names and body size the broker accepts (checked by the producer at staging time)
    name_pattern = C.ROCKETMQ_NAME_PATTERN
    max_body_bytes = C.ROCKETMQ_MAX_BODY_BYTES

    def __init__(self, producer: _BrokerSimProducer) -> None:
        self.producer = producer

    def send(self, message: OutgoingMessage) -> SendReceipt:
        try:
            result = self.producer.send(to_message(message))
        except Exception as exc:
            raise SendError(
                f"broker_sim send of {message.message_id} failed: {type(exc).__name__}: {exc}"
            ) from exc
        if result.status is not SendStatus.SEND_OK:
            # stored, but not flushed/replicated in time: the receipt is still where it landed; if the broker
            # loses it the sweeper sees the offset passed without a delivery and sends it again
            log.warning("message %s stored with status %s", message.message_id, result.status.value)
        return SendReceipt(
            queue_id=int(result.queue_id),
            queue_offset=int(result.queue_offset),
            broker_message_id=str(result.offset_msg_id or result.msg_id),
            broker_name=str(getattr(result, "broker_name", "") or ""),
        )

    def resend_topic(self, topic: str, group: str) -> str:
        """Where a resend targeted at ``group`` lands (the sweeper compares its offset there)."""
        return retry_topic(group)

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        """The sweeper's :class:`~reliable.sender.BrokerProbe`, over the producer's own connection."""
        transport = getattr(self.producer, "transport", None)
        if transport is None:
            return None
        return BrokerSimProbe(transport).max_offset(topic, queue_id, broker_name)


def sweeper_sender(rel: object) -> BrokerSimSender:
    """``reliable sweep --sender reliable.adapters.broker_sim:sweeper_sender``: a sender to the broker-sim
    name server in ``RELIABLE_BROKER_SIM_NAMESRV`` (default 127.0.0.1:9876), producer group
    ``RELIABLE_SENDER_GROUP`` (default ``reliable_sweeper``).

    The producer avoids a broker group that failed or answered slowly (RocketMQ's
    ``sendLatencyFaultEnable``): a failed send isolates its group for 10 minutes (a slow one for 30 s and
    up) unless every group is isolated, so the resends of a round go to the groups that answer instead of
    every second one waiting out a hung master's send timeout."""
    from broker_sim.client.producer import Producer

    namesrv = os.environ.get(C.ENV_BROKER_SIM_NAMESRV) or C.DEFAULT_NAMESRV
    group = os.environ.get(C.ENV_SENDER_GROUP) or C.DEFAULT_SENDER_GROUP
    return BrokerSimSender(Producer(namesrv, group, send_latency_fault_enable=True))


class ProbeWarnings:
    """A failed probe is counted (``reliable_sweeper_probe_failures{broker_name}``) and logged at WARNING once
    per broker group per :attr:`period_s` (the rows of a dead or hung group would otherwise log one line each,
    every round); the others of the period at DEBUG. One per process: the sweeper builds a probe per
    question."""

    def __init__(self, period_s: float = 60.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.period_s = period_s
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}  # broker group -> when its last warning was logged

    def failed(self, broker_name: str, topic: str, queue_id: int, exc: Exception) -> None:
        sweeper_metrics.PROBE_FAILURES.labels(broker_name).inc()
        now = self.monotonic()
        with self._lock:
            last = self._last.get(broker_name)
            warn = last is None or now - last >= self.period_s
            if warn:
                self._last[broker_name] = now
        if warn:
            log.warning(
                "broker group %s does not answer the sweeper's probe (max offset of %s:%d: %s: %s): the loss "
                "of its rows cannot be proved, they are held; this warning repeats once every %g s while "
                "it lasts (count: reliable_sweeper_probe_failures)",
                broker_name or "(unnamed)", topic, queue_id, type(exc).__name__, exc, self.period_s,
            )  # fmt: skip
        else:
            log.debug("max offset of %s %s:%d unknown: %s", topic, broker_name, queue_id, exc)


#: the process's probe warnings (see :class:`ProbeWarnings`)
PROBE_WARNINGS = ProbeWarnings()


class BrokerSimProbe:
    """A :class:`~reliable.sender.BrokerProbe` over a broker_sim transport (in-process or TCP): a queue's max
    offset, one past its last stored message (GET_MAX_OFFSET).

    With it the sweeper proves a loss (the broker's max offset at or below the copy's offset: it does not
    have it — found on a quiet queue too), tells a merely queued message from a lost one, and estimates how
    long a group needs to reach a queued one.

    On a cluster the question goes to the queue's broker group (its master; its slave while the master is
    down — the transport's read routing). Without a broker name (a position recorded before broker names
    were kept) it is answered only when exactly one broker group of the topic's route has that queue id:
    asking "a" group would compare the copy with another group's queue 0.

    A failure is "cannot tell" (``None``), logged at WARNING once a minute per broker group and counted in
    ``reliable_sweeper_probe_failures`` (:class:`ProbeWarnings`).
    """

    def __init__(self, transport: BrokerTransport) -> None:
        self.transport = transport

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        try:
            name = broker_name or self._only_group(topic, queue_id)
            if name is None:
                log.debug("max offset of %s:%d: several broker groups have that queue", topic, queue_id)
                return None
            return int(self.transport.get_max_offset(topic, queue_id, name))
        except Exception as exc:  # unknown topic, broker down: "cannot tell", the sweeper falls back
            PROBE_WARNINGS.failed(broker_name, topic, queue_id, exc)
            return None

    def _only_group(self, topic: str, queue_id: int) -> str | None:
        """The one broker group whose ``queue_id`` of ``topic`` exists; ``None``: several do."""
        route = self.transport.get_route(topic)
        names = {qd.broker_name for qd in route.queue_datas if qd.read_queue_nums > queue_id}
        if len(names) > 1:
            return None
        return names.pop() if names else ""


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


def send_back_to_dlq(transport: BrokerTransport, group: str) -> DeadLetterFn:
    """A dead-letter action: CONSUMER_SEND_MSG_BACK with delay level -1 (the broker moves it to %DLQ%)."""

    def dead_letter(msg: MessageExt) -> None:
        transport.consumer_send_msg_back(
            ConsumerSendMsgBackRequest(
                group=group,
                offset=msg.commit_log_offset,
                delay_level=-1,
                origin_msg_id=msg.msg_id,
                origin_topic=msg.properties.get(Prop.RETRY_TOPIC, msg.topic),
                broker_name=msg.broker_name or "",  # the group that stored it (several in a cluster)
            )
        )

    return dead_letter


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
    is answered ``RECONSUME_LATER`` if any message needs it (broker_sim then sends every message of the
    batch back; the guard turns the already-applied ones into duplicates). An exception from the handler
    propagates: broker_sim treats a raising listener as ``RECONSUME_LATER``, never as an ack.

    ``max_reconsume_times`` is the consumer's (``PushConsumer(max_reconsume_times=…)``, 16 by default): a
    delivery at that limit is the broker's last (``Envelope.last_attempt``), so a handler failure there
    ends the group's row ``DEAD`` with the guard's reason even below the guard's ``max_attempts``. Keep the
    two equal; ``None`` marks nothing.
    """

    def __init__(
        self,
        handler: Callable[[Envelope], ConsumeResult],
        dead_letter: DeadLetterFn | None = None,
        *,
        batch: bool = True,
        group: str | None = None,
        max_reconsume_times: int | None = C.ROCKETMQ_MAX_RECONSUME_TIMES,
    ) -> None:
        self.handler = handler
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
            return results
        return [self.handler(env) for env in envs]

    def __call__(self, msgs: Sequence[MessageExt], *context: Any) -> ConsumeStatus:
        later = False
        for msg, result in zip(msgs, self._results(msgs), strict=True):
            self.stats.delivered += 1
            if result is ConsumeResult.SUCCESS:
                self.stats.success += 1
            elif result is ConsumeResult.DEAD_LETTER and self._dead_letter(msg):
                self.stats.dead_lettered += 1
            else:
                self.stats.reconsume_later += 1
                later = True
        return ConsumeStatus.RECONSUME_LATER if later else ConsumeStatus.CONSUME_SUCCESS

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
