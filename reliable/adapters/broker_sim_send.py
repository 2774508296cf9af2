"""broker_sim adapter, the sending side: the :class:`~reliable.sender.Sender` over a broker_sim ``Producer``
(the stub-first producer's and the sweeper's) and the sweeper's :class:`~reliable.sender.BrokerProbe`.

A targeted send (``OutgoingMessage.target_group``) goes to ``%RETRY%{group}`` with the original topic in
``RETRY_TOPIC``, so only that group receives it; the probe's max offset (GET_MAX_OFFSET) of a queue, asked
of that queue's broker group, proves a loss. Re-exported by :mod:`reliable.adapters.broker_sim`, whose
docstring describes the whole adapter.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from broker_sim.client.message import Message, Prop, SendStatus
from broker_sim.client.transport import BrokerTransport
from reliable import constants as C
from reliable.errors import SendError
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.sweeper import metrics as sweeper_metrics

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
        probe = self._probe()
        return None if probe is None else probe.max_offset(topic, queue_id, broker_name)

    def min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        """The sweeper's :class:`~reliable.sender.RetentionProbe`, over the producer's own connection."""
        probe = self._probe()
        return None if probe is None else probe.min_offset(topic, queue_id, broker_name)

    def _probe(self) -> BrokerSimProbe | None:
        transport = getattr(self.producer, "transport", None)
        return None if transport is None else BrokerSimProbe(transport)


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

    def __init__(self, transport: BrokerTransport, warnings: ProbeWarnings = PROBE_WARNINGS) -> None:
        self.transport = transport
        #: the process's shared rate limit by default (every probe of a sweeper speaks for one process)
        self.warnings = warnings

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return self._offset(self.transport.get_max_offset, "max", topic, queue_id, broker_name)

    def min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        """GET_MIN_OFFSET: the first offset the broker still stores (its retention deleted those below)."""
        return self._offset(self.transport.get_min_offset, "min", topic, queue_id, broker_name)

    def _offset(
        self, ask: Callable[[str, int, str], int], end: str, topic: str, queue_id: int, broker_name: str
    ) -> int | None:
        try:
            name = broker_name or self._only_group(topic, queue_id)
            if name is None:
                log.debug("%s offset of %s:%d: several broker groups have that queue", end, topic, queue_id)
                return None
            return int(ask(topic, queue_id, name))
        except Exception as exc:  # unknown topic, broker down: "cannot tell", the sweeper falls back
            self.warnings.failed(broker_name, topic, queue_id, exc)
            return None

    def _only_group(self, topic: str, queue_id: int) -> str | None:
        """The one broker group whose ``queue_id`` of ``topic`` exists; ``None``: several do."""
        route = self.transport.get_route(topic)
        names = {qd.broker_name for qd in route.queue_datas if qd.read_queue_nums > queue_id}
        if len(names) > 1:
            return None
        return names.pop() if names else ""
