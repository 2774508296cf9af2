"""What producers and consumers share: a client id, a transport, a clock, a scheduler and a channel the broker
can call back on (CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED)."""

from __future__ import annotations

import itertools
import logging
import os
import re
import socket
from typing import Any, Protocol

from broker_sim.client.transport import transport_for
from broker_sim.clock import Clock, SystemClock
from broker_sim.common.channels import CheckTransactionStateRequest
from broker_sim.common.errors import InvalidMessageError, MQClientError
from broker_sim.common.message import Message, MessageExt, MessageQueue
from broker_sim.common.transport import BrokerTransport, ClockedTransport

log = logging.getLogger(__name__)

_instance_counter = itertools.count(1)
_NAME_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
_GROUP_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")


def _local_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def new_client_id(instance_name: str | None) -> str:
    """``ip@instance``; the default instance is ``pid#n`` so two clients in one process never share an id."""
    return f"{_local_ip()}@{instance_name or f'{os.getpid()}#{next(_instance_counter)}'}"


def check_group(group: str) -> None:
    if not group or len(group) > 255 or not _GROUP_RE.match(group):
        raise ValueError(f"group name {group!r} must match [%|a-zA-Z0-9_-]{{1,255}}")


def check_message(msg: Message, max_message_size: int) -> None:
    """The client-side validation RocketMQ's ``Validators.checkMessage`` does."""
    if not isinstance(msg, Message):
        raise InvalidMessageError(f"expected a Message, got {type(msg).__name__}")
    if not msg.topic or len(msg.topic.encode()) > 127 or not _NAME_RE.match(msg.topic):
        raise InvalidMessageError(f"topic {msg.topic!r} must match [%|a-zA-Z0-9_-]{{1,127}}")
    if not isinstance(msg.body, bytes | bytearray) or len(msg.body) == 0:
        raise InvalidMessageError("the message body is empty")
    if len(msg.body) > max_message_size:
        raise InvalidMessageError(f"the message body is {len(msg.body)} bytes, more than {max_message_size}")


class AdminService(Protocol):
    """What a client's ``admin`` attribute serves (a push consumer's ``ConsumerAdmin``)."""

    def reset_offset(self, topic: str, group: str, offsets: dict[MessageQueue, int]) -> None: ...

    def running_info(self) -> dict[str, Any]: ...

    def consume_directly(self, message: MessageExt) -> dict[str, Any]: ...


class ClientBase:
    """Holds the transport and the broker callback channel; subclasses override the callbacks they serve."""

    def __init__(self, broker_or_address: object, *, clock: Clock | None, instance_name: str | None) -> None:
        self.transport: BrokerTransport = transport_for(broker_or_address)
        if clock is None:
            clock = self.transport.clock if isinstance(self.transport, ClockedTransport) else SystemClock()
        self.clock: Clock = clock
        self.client_id = new_client_id(instance_name)

    # -- ClientChannel ---------------------------------------------------------------------------------------

    @property
    def remote_address(self) -> str:
        return self.client_id

    def check_transaction_state(
        self, producer_group: str, request: CheckTransactionStateRequest, message: MessageExt
    ) -> None:
        log.warning(
            "client %s got a transaction check for %s but is not a transaction producer",
            self.client_id,
            request.msg_id,
        )

    def notify_consumer_ids_changed(self, consumer_group: str) -> None:
        log.debug("client %s: consumer ids of %s changed (ignored)", self.client_id, consumer_group)

    # -- AdminChannel: served by ``self.admin`` (push consumers have one); other clients refuse -------------

    def _admin(self) -> AdminService:
        admin: AdminService | None = getattr(self, "admin", None)
        if admin is None:
            raise MQClientError(f"client {self.client_id} is not a push consumer; it serves no admin request")
        return admin

    def reset_offset(self, client_id: str, topic: str, group: str, offsets: dict[MessageQueue, int]) -> None:
        self._admin().reset_offset(topic, group, offsets)

    def consumer_running_info(self, client_id: str, group: str) -> dict[str, Any]:
        return self._admin().running_info()

    def consume_message_directly(self, client_id: str, group: str, message: MessageExt) -> dict[str, Any]:
        return self._admin().consume_directly(message)
