"""The Kafka :class:`~reliable.sender.Sender` for the stub producer and the resend sweeper.

An idempotent producer with ``acks=all``; ``send`` returns only once the delivery report arrived, and the
report's partition and offset become the receipt's ``queue_id`` and ``queue_offset`` (what the sweeper
compares with the group's watermark and the probe's high watermark). The message id travels as the record key
(so every resend of one message lands on the same partition) and in the ``message-id`` header.

Kafka cannot address one consumer group: a targeted resend (``target_group`` set) goes to the topic with a
``reliable-target-group`` header, and the other groups' guards suppress the duplicate.

A failed delivery is tried once more with a fresh producer before ``send`` gives up: after the broker lost
its data the idempotent producer's state no longer matches the broker's, and librdkafka keeps timing out
instead of reporting a fatal error. (So a broker that is down costs ``2 × timeout_s`` per send.)
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from reliable import constants as C
from reliable.adapters.kafka.admin import KafkaProbe, producer_config
from reliable.adapters.kafka_common import send_headers
from reliable.errors import ConfigurationError, SendError
from reliable.sender import OutgoingMessage, SendReceipt

log = logging.getLogger("reliable.adapters.kafka")


class _Retriable(Exception):
    """The broker did not acknowledge the record (timeout or error report): worth one fresh producer."""


class KafkaSender:
    """Sender (and :class:`~reliable.sender.BrokerProbe`) over one idempotent producer; thread-safe."""

    #: a targeted resend goes to the topic (every group gets it): the sweeper sends one copy per message
    targets_groups = False

    def __init__(
        self,
        bootstrap: str,
        *,
        config: Mapping[str, Any] | None = None,
        timeout_s: float = 10.0,
        id_header: str = C.KAFKA_ID_HEADER,
    ) -> None:
        self._config = producer_config(
            bootstrap, {"message.timeout.ms": int(timeout_s * 1000), **(config or {})}
        )
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self.id_header = id_header
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        self._probe: KafkaProbe | None = None

    def _live(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(self._config)
        return self._producer

    def send(self, message: OutgoingMessage) -> SendReceipt:
        headers = send_headers(message, self.id_header)
        with self._lock:
            try:
                msg = self._send_once(message, headers)
            except _Retriable as exc:
                # a fresh producer, once: after a broker lost its state (restart, unclean leader election)
                # the idempotent producer's sequence numbers no longer match, and librdkafka keeps timing
                # out rather than reporting a fatal error (a first copy that did land is a duplicate the
                # guard absorbs)
                log.warning(
                    "send of %s failed (%s): retrying once with a fresh producer", message.message_id, exc
                )
                self._producer = None
                try:
                    msg = self._send_once(message, headers)
                except _Retriable as again:
                    self._producer = None
                    raise SendError(f"message {message.message_id}: {again}") from None
        partition, offset = msg.partition(), msg.offset()
        if partition is None or offset is None or offset < 0:
            raise SendError(f"message {message.message_id}: delivery report without a position")
        return SendReceipt(partition, offset, f"{message.topic}-{partition}-{offset}")

    def _send_once(self, message: OutgoingMessage, headers: list[tuple[str, str | bytes | None]]) -> Message:
        reports: list[tuple[KafkaError | None, Message]] = []
        producer = self._live()
        try:
            producer.produce(
                message.topic,
                key=message.message_id.encode("utf-8"),
                value=message.body,
                headers=headers,
                on_delivery=lambda err, msg: reports.append((err, msg)),
            )
        except (KafkaException, BufferError) as exc:
            raise SendError(f"message {message.message_id}: produce refused: {exc}") from exc
        producer.flush(self.timeout_s + 1.0)
        if not reports:
            raise _Retriable(f"no delivery report within {self.timeout_s}s")
        err, msg = reports[0]
        if err is not None:
            raise _Retriable(f"{err.name()}: {err.str()}")
        return msg

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        """:class:`~reliable.sender.BrokerProbe`: the partition's high watermark (``None``: cannot tell)."""
        return self._kafka_probe().max_offset(topic, queue_id)

    def min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        """:class:`~reliable.sender.RetentionProbe`: the partition's log start offset."""
        return self._kafka_probe().min_offset(topic, queue_id)

    def _kafka_probe(self) -> KafkaProbe:
        if self._probe is None:
            self._probe = KafkaProbe(self.bootstrap)
        return self._probe

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.flush(self.timeout_s)
                self._producer = None
            if self._probe is not None:
                self._probe.close()
                self._probe = None

    def __enter__(self) -> KafkaSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sweeper_sender(rel: object = None) -> KafkaSender:
    """``reliable sweep --sender reliable.adapters.kafka:sweeper_sender``: bootstrap from the environment."""
    bootstrap = os.environ.get(C.ENV_KAFKA_BOOTSTRAP)
    if not bootstrap:
        raise ConfigurationError(f"no Kafka bootstrap servers: set {C.ENV_KAFKA_BOOTSTRAP}")
    return KafkaSender(bootstrap)
