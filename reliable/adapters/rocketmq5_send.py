"""The RocketMQ 5.x sending side: :class:`RocketMQ5Sender` (``StubProducer``'s and the sweeper's sender), the
loss probe over ``QueryOffset`` (:class:`RocketMQ5Probe`), the sweeper's sender from the environment, and the
lazy import of the official client that the consumer side (:mod:`reliable.adapters.rocketmq5`) shares.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

from reliable import constants as C
from reliable.errors import ConfigurationError, SendError
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.staged import DELAY_PROPERTY, MESSAGE_GROUP_PROPERTY, held_back_s

log = logging.getLogger("reliable.adapters.rocketmq5")


def load_client() -> Any:
    """``(rocketmq, rocketmq.grpc_protocol)`` of the 5.x client, or ``ConfigurationError`` saying why not."""
    try:
        import rocketmq
        from rocketmq import grpc_protocol
    except ImportError as exc:
        raise ConfigurationError(
            f"the RocketMQ 5.x adapter needs rocketmq-python-client (pip install reliable[rocketmq5]): {exc}"
        ) from exc
    if not hasattr(rocketmq, "SimpleConsumer"):
        raise ConfigurationError("'rocketmq' here is the 4.x client; the 5.x adapter needs its own venv")
    return rocketmq, grpc_protocol


class RocketMQ5Sender:
    """A :class:`~reliable.sender.Sender` over a started ``rocketmq.Producer``; with a ``probe`` (as
    :meth:`connect` gives it) also the :class:`~reliable.sender.BrokerProbe` the sweeper asks."""

    #: a targeted resend goes to the topic (every group gets it): the sweeper sends one copy per message
    targets_groups = False

    #: the body size the broker accepts (checked by the producer at staging time)
    max_body_bytes = C.ROCKETMQ_MAX_BODY_BYTES

    def __init__(self, producer: Any, probe: RocketMQ5Probe | None = None) -> None:
        self.producer = producer
        self.probe = probe

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return self.probe.max_offset(topic, queue_id, broker_name) if self.probe is not None else None

    def min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return self.probe.min_offset(topic, queue_id, broker_name) if self.probe is not None else None

    @classmethod
    def connect(
        cls, endpoint: str, topics: tuple[str, ...] = (), request_timeout_s: int = 5
    ) -> RocketMQ5Sender:
        rocketmq, _ = load_client()
        config = rocketmq.ClientConfiguration(
            endpoint, rocketmq.Credentials(), request_timeout=request_timeout_s
        )
        producer = rocketmq.Producer(config, topics)
        producer.startup()
        return cls(producer, RocketMQ5Probe(endpoint, timeout_s=request_timeout_s))

    def close(self) -> None:
        self.producer.shutdown()
        if self.probe is not None:
            self.probe.close()

    def send(self, message: OutgoingMessage) -> SendReceipt:
        rocketmq, _ = load_client()
        msg = rocketmq.Message()
        msg.topic = message.topic
        msg.body = message.body
        msg.keys = message.message_id
        if message.tags:
            msg.tag = message.tags
        properties = dict(message.properties)
        group = properties.pop(MESSAGE_GROUP_PROPERTY, None)
        if group:
            # the message's own FIFO message group (a system field): a FIFO consumer group keeps its order
            msg.message_group = group
        if DELAY_PROPERTY in properties:  # a system property over 5.x: the delivery time says it instead
            delay_s = held_back_s(properties)
            del properties[DELAY_PROPERTY]
            if delay_s > 0:
                # whole seconds since the epoch: the 5.1.2 client copies the value into the protocol
                # Timestamp's ``seconds`` (its docstring says ms; a ms value held the message ~1000x too
                # long, never delivered); rounded up, so the message is not visible before its delay
                msg.delivery_timestamp = math.ceil(time.time() + delay_s)
        if message.target_group:  # the topic's other groups tell a copy meant for this one by it
            properties[C.ROCKETMQ5_TARGET_GROUP_PROPERTY] = message.target_group
        for key, value in properties.items():
            msg.add_property(key, value)
        try:
            receipt = self.producer.send(msg)
        except Exception as exc:
            raise SendError(
                f"RocketMQ 5.x send of {message.message_id} failed: {type(exc).__name__}: {exc}"
            ) from exc
        return SendReceipt(C.UNKNOWN_QUEUE_ID, int(receipt.offset), receipt.message_id)


class RocketMQ5Probe:
    """The loss probe over the 5.x protocol's QueryOffset (a queue's max offset, and its min offset)."""

    def __init__(self, endpoint: str, timeout_s: float = 5.0) -> None:
        import grpc

        _, pb = load_client()
        self._pb = pb
        self._channel = grpc.insecure_channel(endpoint)
        self._stub = pb.MessagingServiceStub(self._channel)
        self.timeout_s = timeout_s

    def close(self) -> None:
        self._channel.close()

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        from rocketmq.grpc_protocol import definition_pb2

        return self._query(definition_pb2.QueryOffsetPolicy.END, topic, queue_id, broker_name)

    def min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        """QueryOffset BEGINNING: the first offset the broker still stores (:class:`RetentionProbe`)."""
        from rocketmq.grpc_protocol import definition_pb2

        return self._query(definition_pb2.QueryOffsetPolicy.BEGINNING, topic, queue_id, broker_name)

    def _query(self, policy: int, topic: str, queue_id: int, broker_name: str) -> int | None:
        if queue_id < 0:
            return None
        from rocketmq.grpc_protocol import service_pb2

        req = service_pb2.QueryOffsetRequest()
        req.message_queue.topic.name = topic
        req.message_queue.id = queue_id
        if broker_name:  # the proxy routes the question to that broker group
            req.message_queue.broker.name = broker_name
        req.query_offset_policy = policy
        try:
            res = self._stub.QueryOffset(req, timeout=self.timeout_s)
        except Exception:
            log.exception("QueryOffset %s/%d failed", topic, queue_id)
            return None
        return int(res.offset) if res.status.code == self._pb.Code.OK else None


def sweeper_sender(rel: object) -> RocketMQ5Sender:
    """``reliable sweep --sender reliable.adapters.rocketmq5:sweeper_sender``: a 5.x producer to the endpoint
    in ``RELIABLE_ROCKETMQ5_ENDPOINT`` (default 127.0.0.1:8081)."""
    return RocketMQ5Sender.connect(os.environ.get(C.ENV_ROCKETMQ5_ENDPOINT) or C.DEFAULT_ROCKETMQ5_ENDPOINT)
