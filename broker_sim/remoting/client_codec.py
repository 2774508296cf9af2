"""The header fields of a client's SEND_MESSAGE (10) / SEND_BATCH_MESSAGE (320), PULL_MESSAGE (11),
CONSUMER_SEND_MSG_BACK (36) and END_TRANSACTION (37) requests, and the decoding of their replies — the part
of :mod:`broker_sim.remoting.client_transport` that is pure encoding. A reply that does not parse raises
:class:`~broker_sim.remoting.errors.RemotingError`, which :func:`reply_errors` turns into the transport
contract's TransportError."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from broker_sim.common.errors import TransportError, error_for_code
from broker_sim.common.message import MessageQueue, properties_to_string
from broker_sim.common.requests import (
    ConsumerSendMsgBackRequest,
    EndTransactionRequest,
    PullMessageRequest,
    PullMessageResponse,
    ResponseCode,
    SendMessageRequest,
    SendMessageResponse,
)
from broker_sim.remoting.errors import RemotingError
from broker_sim.remoting.frame import RemotingCommand
from broker_sim.remoting.header import Fields
from broker_sim.remoting.records import decode_records, split_records


def check(reply: RemotingCommand, *accepted: int) -> RemotingCommand:
    """The reply, or the typed error of its code (SUCCESS and ``accepted`` pass)."""
    if reply.code not in (ResponseCode.SUCCESS, *accepted):
        raise error_for_code(reply.code, reply.remark or f"request failed with code {reply.code}")
    return reply


def send_fields(request: SendMessageRequest) -> dict[str, object]:
    return {
        "producerGroup": request.producer_group,
        "topic": request.topic,
        "defaultTopic": request.default_topic,
        "defaultTopicQueueNums": request.default_topic_queue_nums,
        "queueId": request.queue_id,
        "sysFlag": request.sys_flag,
        "bornTimestamp": request.born_timestamp,
        "flag": request.flag,
        "properties": properties_to_string(request.properties),
        "reconsumeTimes": request.reconsume_times,
        "unitMode": request.unit_mode,
        "maxReconsumeTimes": request.max_reconsume_times,
        "batch": request.batch,
    }


def send_response(reply: RemotingCommand) -> SendMessageResponse:
    accepted = (
        ResponseCode.FLUSH_DISK_TIMEOUT,
        ResponseCode.FLUSH_SLAVE_TIMEOUT,
        ResponseCode.SLAVE_NOT_AVAILABLE,
    )
    check(reply, *accepted)
    f = Fields(reply.ext_fields)
    return SendMessageResponse(
        code=ResponseCode(reply.code),
        msg_id=f.text("msgId"),
        queue_id=f.num("queueId"),
        queue_offset=f.num("queueOffset"),
        transaction_id=f.opt("transactionId"),
        remark=reply.remark or "",
    )


def pull_fields(request: PullMessageRequest) -> dict[str, object]:
    return {
        "consumerGroup": request.consumer_group,
        "topic": request.topic,
        "queueId": request.queue_id,
        "queueOffset": request.queue_offset,
        "maxMsgNums": request.max_msg_nums,
        "sysFlag": request.sys_flag,
        "commitOffset": request.commit_offset,
        "suspendTimeoutMillis": request.suspend_timeout_ms,
        "subscription": request.subscription,
        "subVersion": request.sub_version,
        "expressionType": str(request.expression_type),
    }


def pull_response(reply: RemotingCommand, broker_name: str) -> PullMessageResponse:
    pull_codes = (
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
        ResponseCode.PULL_OFFSET_MOVED,
    )
    check(reply, *pull_codes)
    f = Fields(reply.ext_fields)
    messages = decode_records(reply.body, broker_name=broker_name) if reply.body else []
    records = [reply.body[s : s + n] for s, n in split_records(reply.body)] if reply.body else []
    return PullMessageResponse(
        code=ResponseCode(reply.code),
        next_begin_offset=f.num("nextBeginOffset"),
        min_offset=f.num("minOffset", 0),
        max_offset=f.num("maxOffset", 0),
        messages=messages,
        records=records,
        suggest_which_broker_id=f.num("suggestWhichBrokerId", 0),
        remark=reply.remark or "",
    )


P = ParamSpec("P")
R = TypeVar("R")


def send_back_fields(request: ConsumerSendMsgBackRequest) -> dict[str, object]:
    return {
        "group": request.group,
        "offset": request.offset,
        "delayLevel": request.delay_level,
        "originMsgId": request.origin_msg_id,
        "originTopic": request.origin_topic,
        "unitMode": request.unit_mode,
        "maxReconsumeTimes": request.max_reconsume_times,
    }


def end_transaction_fields(request: EndTransactionRequest) -> dict[str, object]:
    return {
        "producerGroup": request.producer_group,
        "msgId": request.msg_id,
        "transactionId": request.transaction_id,
        "tranStateTableOffset": request.tran_state_table_offset,
        "commitLogOffset": request.commit_log_offset,
        "commitOrRollback": int(request.commit_or_rollback),
        "fromTransactionCheck": request.from_transaction_check,
    }


def reply_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """A reply that does not parse (bad JSON body, bad record, missing field) is a transport fault for the
    caller — the transport contract's "undecodable reply" — not a remoting-internal exception."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except RemotingError as exc:
            raise TransportError(f"undecodable reply: {exc}") from exc

    return wrapper


def by_broker(mqs: set[MessageQueue]) -> dict[str, set[MessageQueue]]:
    """Queues grouped by broker group name (a request per group, as RebalanceImpl.lockAll does)."""
    out: dict[str, set[MessageQueue]] = {}
    for mq in mqs:
        out.setdefault(mq.broker_name, set()).add(mq)
    return out
