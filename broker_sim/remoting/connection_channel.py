"""The broker's handle on a client connected over TCP (:class:`ClientChannel` and :class:`AdminChannel`),
and the record encoding of a message it sends to clients (check-back, view, admin bodies)."""

from __future__ import annotations

from typing import Any, Protocol

from broker_sim.common.channels import CheckTransactionStateRequest
from broker_sim.common.errors import BrokerResponseError
from broker_sim.common.message import MessageExt, MessageQueue
from broker_sim.remoting import bodies
from broker_sim.remoting.codes import RequestCode, ResponseCode
from broker_sim.remoting.command import RemotingCommand
from broker_sim.remoting.server import Connection


class ConnectionChannel:
    """:class:`ClientChannel` and :class:`AdminChannel` over a TCP connection: broker → client requests are
    oneway frames, except GET_CONSUMER_RUNNING_INFO and CONSUME_MESSAGE_DIRECTLY, which wait (5 s) for the
    client's reply on the same connection."""

    ADMIN_TIMEOUT_S = 5.0

    def __init__(self, conn: Connection, encode_record: RecordEncoder) -> None:
        self.conn = conn
        self._encode_record = encode_record

    @property
    def remote_address(self) -> str:
        return self.conn.peer

    def check_transaction_state(
        self, producer_group: str, request: CheckTransactionStateRequest, message: MessageExt
    ) -> None:
        fields = {
            "msgId": request.msg_id,
            "transactionId": request.transaction_id,
            "offsetMsgId": request.offset_msg_id,
            "tranStateTableOffset": request.tran_state_table_offset,
            "commitLogOffset": request.commit_log_offset,
            "producerGroup": producer_group,
        }
        body = self._encode_record(message)
        self.conn.send(
            RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, fields, body, oneway=True)
        )

    def notify_consumer_ids_changed(self, consumer_group: str) -> None:
        self.conn.send(
            RemotingCommand.request(
                RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": consumer_group}, oneway=True
            )
        )

    def reset_offset(self, client_id: str, topic: str, group: str, offsets: dict[MessageQueue, int]) -> None:
        fields = {"topic": topic, "group": group, "clientId": client_id, "timestamp": 0}
        body = bodies.reset_offset_body(offsets)
        self.conn.send(
            RemotingCommand.request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, fields, body, oneway=True)
        )

    def _ask(self, code: int, fields: dict[str, Any], body: bytes = b"") -> dict[str, Any]:
        try:
            reply = self.conn.invoke(RemotingCommand.request(code, fields, body), self.ADMIN_TIMEOUT_S)
        except (TimeoutError, ConnectionError) as exc:
            raise BrokerResponseError(str(exc)) from exc
        if reply.code != ResponseCode.SUCCESS:
            raise BrokerResponseError(reply.remark or f"the client answered code {reply.code}")
        obj = bodies.load_json(reply.body, "client reply")
        if not isinstance(obj, dict):
            raise BrokerResponseError("the client's reply is not a JSON object")
        return obj

    def consumer_running_info(self, client_id: str, group: str) -> dict[str, Any]:
        fields = {"consumerGroup": group, "clientId": client_id, "jstackEnable": False}
        return self._ask(RequestCode.GET_CONSUMER_RUNNING_INFO, fields)

    def consume_message_directly(self, client_id: str, group: str, message: MessageExt) -> dict[str, Any]:
        fields = {"consumerGroup": group, "clientId": client_id, "msgId": message.offset_msg_id}
        return self._ask(RequestCode.CONSUME_MESSAGE_DIRECTLY, fields, self._encode_record(message))


class RecordEncoder(Protocol):
    def __call__(self, message: MessageExt, /) -> bytes: ...


def encode_message_ext(message: MessageExt) -> bytes:
    """A client-side :class:`MessageExt` as a commit-log record (CHECK_TRANSACTION_STATE and VIEW bodies)."""
    from broker_sim.store.message_record import MessageInner, encode_record, host_bytes

    def split(addr: str) -> tuple[str, int]:
        host, _, port = addr.rpartition(":")
        return host or "127.0.0.1", int(port or 0)

    inner = MessageInner(
        topic=message.topic,
        body=message.body,
        queue_id=message.queue_id,
        flag=message.flag,
        properties=dict(message.properties),
        sys_flag=message.sys_flag & ~0x1,  # the client type holds the inflated body
        born_timestamp=message.born_timestamp,
        born_host=split(message.born_host),
        reconsume_times=message.reconsume_times,
        prepared_transaction_offset=message.prepared_transaction_offset,
    )
    return encode_record(
        inner,
        message.queue_offset,
        message.commit_log_offset,
        message.store_timestamp,
        host_bytes(split(message.store_host)),
    )
