"""The broker's handles on connected clients, for the requests a broker sends *to* a client
(CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED, and the admin requests a client may serve).

Why a module of its own: these run the other way from everything in :mod:`broker_sim.common.requests`
(client → broker), and the broker, the in-process transport and the TCP server's connection channel are
the only code that implements or calls them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from broker_sim.common.message import MessageExt, MessageQueue


@dataclass(frozen=True)
class CheckTransactionStateRequest:
    """CHECK_TRANSACTION_STATE (39), broker → producer; the client answers with END_TRANSACTION."""

    msg_id: str  # client UNIQ_KEY
    transaction_id: str | None
    offset_msg_id: str
    tran_state_table_offset: int
    commit_log_offset: int


@runtime_checkable
class ClientChannel(Protocol):
    """The broker's handle on one connected client, for broker → client requests (both oneway)."""

    @property
    def remote_address(self) -> str: ...

    def check_transaction_state(
        self, producer_group: str, request: CheckTransactionStateRequest, message: MessageExt
    ) -> None: ...

    def notify_consumer_ids_changed(self, consumer_group: str) -> None: ...


@runtime_checkable
class AdminChannel(Protocol):
    """Broker → client admin requests a client may serve besides :class:`ClientChannel`'s (broker_sim's own
    clients do; the C++ client 1.2 does not): RESET_CONSUMER_CLIENT_OFFSET (220, oneway),
    GET_CONSUMER_RUNNING_INFO (307) and CONSUME_MESSAGE_DIRECTLY (309). ``client_id`` picks the client
    when one connection carries several."""

    def reset_offset(
        self, client_id: str, topic: str, group: str, offsets: dict[MessageQueue, int]
    ) -> None: ...

    def consumer_running_info(self, client_id: str, group: str) -> dict[str, Any]: ...

    def consume_message_directly(self, client_id: str, group: str, message: MessageExt) -> dict[str, Any]: ...
