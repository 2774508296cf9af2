"""Requests the broker sends to a client over its connection (RocketMQ's ``ClientRemotingProcessor``):
NOTIFY_CONSUMER_IDS_CHANGED (40) and CHECK_TRANSACTION_STATE (39), oneway, to every client of the
connection; RESET_CONSUMER_CLIENT_OFFSET (220, oneway), GET_CONSUMER_RUNNING_INFO (307) and
CONSUME_MESSAGE_DIRECTLY (309) to the client named by ``clientId``."""

from __future__ import annotations

import logging

from broker_sim.common.channels import AdminChannel, CheckTransactionStateRequest, ClientChannel
from broker_sim.remoting import bodies
from broker_sim.remoting.codes import RequestCode, ResponseCode
from broker_sim.remoting.command import RemotingCommand
from broker_sim.remoting.header import Fields
from broker_sim.remoting.records import decode_record

log = logging.getLogger("broker_sim.remoting.client_transport")

ADMIN_REQUESTS = frozenset(
    {
        RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
        RequestCode.GET_CONSUMER_RUNNING_INFO,
        RequestCode.CONSUME_MESSAGE_DIRECTLY,
    }
)


def serve_client_request(cmd: RemotingCommand, channels: dict[str, ClientChannel]) -> RemotingCommand | None:
    """Run a broker → client request against the client channels registered on one connection; the
    returned command (if any) is the reply."""
    f = Fields(cmd.ext_fields)
    if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
        for ch in channels.values():
            ch.notify_consumer_ids_changed(f.text("consumerGroup"))
    elif cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
        message = decode_record(cmd.body)
        req = CheckTransactionStateRequest(
            msg_id=f.text("msgId"),
            transaction_id=f.opt("transactionId"),
            offset_msg_id=f.text("offsetMsgId"),
            tran_state_table_offset=f.num("tranStateTableOffset", 0),
            commit_log_offset=f.num("commitLogOffset"),
        )
        group = f.text("producerGroup", "")
        for ch in channels.values():
            ch.check_transaction_state(group, req, message)
    elif cmd.code in ADMIN_REQUESTS:
        return _admin_request(cmd, f, channels)
    else:
        log.info("ignoring server request code %d", cmd.code)
    return None


def _admin_request(
    cmd: RemotingCommand, f: Fields, channels: dict[str, ClientChannel]
) -> RemotingCommand | None:
    """220 / 307 / 309 for the client named by ``clientId`` (``ClientRemotingProcessor``)."""
    client_id, group = f.text("clientId", ""), f.text("group", "") or f.text("consumerGroup", "")
    ch = channels.get(client_id)
    if not isinstance(ch, AdminChannel):
        return cmd.reply(ResponseCode.SYSTEM_ERROR, f"no consumer {client_id!r} on this connection")
    if cmd.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
        ch.reset_offset(client_id, f.text("topic"), group, bodies.parse_reset_offset(cmd.body))
        return None
    if cmd.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
        info = ch.consumer_running_info(client_id, group)
    else:
        info = ch.consume_message_directly(client_id, group, decode_record(cmd.body))
    return cmd.reply(ResponseCode.SUCCESS, body=bodies.dump_json(info))
