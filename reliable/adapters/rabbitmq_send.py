"""RabbitMQ's sending side over ``pika``: the confirming :class:`RabbitMQSender`, the sweeper's sender from
the environment, and the blocking connection both this and the consumer (:mod:`reliable.adapters.rabbitmq`,
which re-exports the sender and :func:`sweeper_sender`) open.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.spec import BasicProperties

from reliable import constants as C
from reliable.adapters import amqp
from reliable.errors import ConfigurationError, SendError
from reliable.sender import OutgoingMessage, SendReceipt

log = logging.getLogger("reliable.adapters.rabbitmq")


def parameters(url: str, name: str | None = None) -> pika.URLParameters:
    try:
        params = pika.URLParameters(url)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"bad AMQP URL {url!r}: {exc}") from None
    if name:  # shown by the management UI and `rabbitmqctl list_connections client_properties`
        params.client_properties = {"connection_name": name}
    return params


def connect(url: str, name: str | None = None) -> BlockingConnection:
    """A blocking connection; a malformed URL is a configuration error, not a network one."""
    return BlockingConnection(parameters(url, name))


class RabbitMQSender:
    """A :class:`~reliable.sender.Sender` publishing persistent messages with publisher confirms.

    ``send`` returns only once the broker confirmed the message (and, with ``mandatory``, routed it to at
    least one queue); anything else raises :class:`SendError` and the stub stays PENDING. The receipt is
    ``queue_id=0`` and ``queue_offset`` = this process's next sequence number (see the module doc for what
    that lets the sweeper infer). The connection is opened lazily and reopened after a failure.
    Thread-safe (a lock around the one connection).
    """

    #: AMQP short strings (the message id, the tags header, header names) hold 255 bytes (staging checks)
    short_string_bytes = C.AMQP_SHORT_STRING_BYTES

    def __init__(
        self,
        url: str,
        *,
        exchange: str = "",
        routing_key: Callable[[OutgoingMessage], str] | None = None,
        group_queue: Callable[[str, str], str] | None = None,
        mandatory: bool = True,
        connection_name: str | None = None,
    ) -> None:
        parameters(url)  # fail early on a malformed URL
        self.url = url
        self.connection_name = connection_name
        self.exchange = exchange
        self.routing_key = routing_key or (lambda m: m.topic)
        #: ``(topic, group) -> queue``: where a resend targeted at one group goes (default: the group's name)
        self.group_queue = group_queue or amqp.default_group_queue
        self.mandatory = mandatory
        self._lock = threading.Lock()
        self._conn: BlockingConnection | None = None
        self._ch: BlockingChannel | None = None

    def resend_route(self, topic: str, group: str) -> str:
        """Where the sweeper's resend targeted at ``group`` goes: that group's own queue. A full queue
        refusing publishes (``x-overflow reject-publish``) refuses only its group's copies, so the sweeper
        counts refusals per queue (:func:`reliable.sweeper.resend.pause_route`), not per topic."""
        return self.group_queue(topic, group)

    def _channel(self) -> BlockingChannel:
        if self._ch is None or not self._ch.is_open:
            if self._conn is None or not self._conn.is_open:
                self._conn = connect(self.url, self.connection_name)
            self._ch = self._conn.channel()
            self._ch.confirm_delivery()
        return self._ch

    def send(self, message: OutgoingMessage) -> SendReceipt:
        pub = amqp.publication(message, self.routing_key(message))
        seq = pub.seq
        props = BasicProperties(
            message_id=pub.message_id,
            delivery_mode=amqp.PERSISTENT,
            content_type=amqp.CONTENT_TYPE,
            headers=pub.headers,
            type=pub.type_,
            timestamp=pub.timestamp,
        )
        exchange, key = amqp.destination(message, self.exchange, pub.routing_key, self.group_queue)
        with self._lock:
            # two tries: a connection left idle past the heartbeat timeout is closed by the broker and only
            # noticed on the next publish; one fresh connection turns that into a normal send. (A publish
            # that did go out before its confirm was lost becomes a duplicate, which the guard suppresses.)
            for attempt in (1, 2):
                try:
                    channel = self._channel()
                    channel.basic_publish(exchange, key, message.body, props, mandatory=self.mandatory)
                    break
                except pika.exceptions.UnroutableError:
                    hint = amqp.unroutable_hint(message, key)
                    raise SendError(
                        f"message {message.message_id}: unroutable (no queue bound){hint}"
                    ) from None
                except pika.exceptions.NackError:
                    raise SendError(f"message {message.message_id}: broker refused it (nack)") from None
                except (pika.exceptions.AMQPError, OSError) as exc:
                    self._drop()
                    if attempt == 2 or isinstance(exc, pika.exceptions.AMQPChannelError):
                        raise SendError(f"message {message.message_id}: {type(exc).__name__}: {exc}") from exc
                    log.info("send of %s: %r; reconnecting once", message.message_id, exc)
        return SendReceipt(queue_id=0, queue_offset=seq, broker_message_id=f"{exchange}/{seq}")

    def _drop(self) -> None:
        conn, self._conn, self._ch = self._conn, None, None
        if conn is not None and conn.is_open:
            try:
                conn.close()
            except (pika.exceptions.AMQPError, OSError) as exc:
                log.debug("closing a failed connection: %r", exc)

    def close(self) -> None:
        with self._lock:
            self._drop()

    def __enter__(self) -> RabbitMQSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sweeper_sender(rel: object = None) -> RabbitMQSender:
    """``reliable sweep --sender reliable.adapters.rabbitmq:sweeper_sender``: a sender from the environment.

    ``RELIABLE_RABBITMQ_URL`` (required), ``RELIABLE_RABBITMQ_EXCHANGE`` (default: the default exchange, so
    the stub's topic must be the queue name) and ``RELIABLE_RABBITMQ_GROUP_QUEUE`` (the queue a resend for
    one group goes to, a format with ``{group}`` and ``{topic}``; default ``{group}``); ``rel`` is accepted
    for the factory signature and unused.
    """
    url = os.environ.get(C.ENV_RABBITMQ_URL)
    if not url:
        raise ConfigurationError(f"no RabbitMQ URL: set {C.ENV_RABBITMQ_URL}")
    queue_format = os.environ.get(C.ENV_RABBITMQ_GROUP_QUEUE) or C.DEFAULT_RABBITMQ_GROUP_QUEUE
    try:
        queue_format.format(group="g", topic="t")
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigurationError(
            f"{C.ENV_RABBITMQ_GROUP_QUEUE}: bad format {queue_format!r}: {exc}"
        ) from None
    return RabbitMQSender(
        url,
        exchange=os.environ.get(C.ENV_RABBITMQ_EXCHANGE, ""),
        group_queue=lambda topic, group: queue_format.format(group=group, topic=topic),
        connection_name="reliable-sweeper",
    )
