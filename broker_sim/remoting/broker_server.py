"""Broker request handlers: each wire request becomes one call on the Broker's request-level API
(:mod:`broker_sim.common.requests`), and its result becomes a reply the real C++ client accepts.

The C++ client is the strictest peer, so replies follow the rules of reference §A: every reply field is a
string (G2), successful SEND/PULL/offset replies always carry fields (G3), a SUCCESS pull never has an empty
body (G10), and pulled records carry the broker's current address as STOREHOST (G7).
"""

from __future__ import annotations

import logging

from broker_sim.common.broker_api import BrokerApi
from broker_sim.common.message import (
    encode_offset_msg_id,
    properties_to_string,
    string_to_properties,
)
from broker_sim.common.requests import (
    ConsumerSendMsgBackRequest,
    EndTransactionRequest,
    PullMessageRequest,
    PullMessageResponse,
    SendMessageRequest,
    SendMessageResponse,
    TransactionType,
)
from broker_sim.faults import SendAckLost
from broker_sim.remoting import bodies
from broker_sim.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from broker_sim.remoting.connection_channel import ConnectionChannel, encode_message_ext
from broker_sim.remoting.frame import RemotingCommand
from broker_sim.remoting.header import Fields, expand_send_v2
from broker_sim.remoting.records import RecordError, with_store_host
from broker_sim.remoting.server import DEFERRED, Connection, Deferred, Handler

log = logging.getLogger("broker_sim.remoting.broker_server")


class BrokerHandlers:
    """Request code → Broker call. ``address`` is the broker's listening "ip:port" (STOREHOST, G7)."""

    def __init__(self, broker: BrokerApi, address: str) -> None:
        self.broker = broker
        self.address = address
        self.channels: dict[str, ConnectionChannel] = {}

    def non_blocking_codes(self, sync_flush: bool) -> set[int]:
        """Codes whose handlers never wait: pulls reply later by themselves (held in the Broker), reads of
        offsets and registries are in memory; writes wait for the disk only under SYNC_FLUSH."""
        codes = {
            RequestCode.PULL_MESSAGE, RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP, RequestCode.QUERY_CONSUMER_OFFSET,
            RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET,
            RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ,
        }  # fmt: skip
        if not sync_flush:
            codes |= {RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}
        return {int(c) for c in codes}

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.SEND_MESSAGE: self.send_message,
            RequestCode.SEND_MESSAGE_V2: self.send_message,
            RequestCode.SEND_BATCH_MESSAGE: self.send_batch_message,
            RequestCode.PULL_MESSAGE: self.pull_message,
            RequestCode.HEART_BEAT: self.heartbeat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.get_consumer_list,
            RequestCode.CHECK_CLIENT_CONFIG: self.check_client_config,
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RequestCode.GET_MAX_OFFSET: self.get_max_offset,
            RequestCode.GET_MIN_OFFSET: self.get_min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset_by_timestamp,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.get_earliest_msg_store_time,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message_by_id,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.consumer_send_msg_back,
            RequestCode.END_TRANSACTION: self.end_transaction,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch_mq,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch_mq,
        }

    # -- send --

    def _send_request(self, cmd: RemotingCommand, conn: Connection) -> SendMessageRequest:
        ext = cmd.ext_fields
        if cmd.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE) and "a" in ext:
            ext = expand_send_v2(ext)
        f = Fields(ext)
        max_rt = f.opt("maxReconsumeTimes")
        return SendMessageRequest(
            producer_group=f.text("producerGroup"),
            topic=f.text("topic"),
            queue_id=f.num("queueId", 0),
            properties=string_to_properties(f.text("properties", "")),
            sys_flag=f.num("sysFlag", 0),
            born_timestamp=f.num("bornTimestamp", 0),
            flag=f.num("flag", 0),
            reconsume_times=f.num("reconsumeTimes", 0),
            unit_mode=f.flag("unitMode"),
            max_reconsume_times=int(max_rt) if max_rt not in (None, "") else None,
            batch=f.flag("batch") or cmd.code == RequestCode.SEND_BATCH_MESSAGE,
            default_topic=f.text("defaultTopic", "TBW102"),
            default_topic_queue_nums=f.num("defaultTopicQueueNums", 4),
            born_host=conn.peer,
        )

    @staticmethod
    def _send_reply(cmd: RemotingCommand, res: SendMessageResponse) -> RemotingCommand:
        return cmd.reply(
            res.code,
            res.remark or None,
            {
                "msgId": res.msg_id,
                "queueId": res.queue_id,
                "queueOffset": res.queue_offset,
                "transactionId": res.transaction_id,
                "MSG_REGION": "DefaultRegion",
            },
        )

    def send_message(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        req = self._send_request(cmd, conn)
        if req.batch:  # the C++ client sends batches as SEND_MESSAGE with batch=1 and a batch body (§F)
            return self.send_batch_message(cmd, conn)
        try:
            return self._send_reply(cmd, self.broker.send_message(req, cmd.body))
        except SendAckLost:
            return None  # stored, but the injector ate the ACK: the client times out and may resend

    def send_batch_message(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        req = self._send_request(cmd, conn)
        try:
            return self._send_reply(cmd, self.broker.send_batch_message(req, bodies.decode_batch(cmd.body)))
        except SendAckLost:
            return None

    # -- pull --

    def pull_message(self, cmd: RemotingCommand, conn: Connection) -> Deferred:
        f = Fields(cmd.ext_fields)
        sys_flag = f.num("sysFlag", 0)
        req = PullMessageRequest(
            consumer_group=f.text("consumerGroup"),
            topic=f.text("topic"),
            queue_id=f.num("queueId"),
            queue_offset=f.num("queueOffset"),
            max_msg_nums=f.num("maxMsgNums", 32),
            sys_flag=sys_flag,
            commit_offset=f.num("commitOffset", 0),
            suspend_timeout_ms=f.num("suspendTimeoutMillis", 15_000),
            subscription=f.opt("subscription") if sys_flag & PullSysFlag.SUBSCRIPTION else None,
            sub_version=f.num("subVersion", 0),
            expression_type=bodies.expression_type(f.text("expressionType", "TAG")),
        )

        def done(result: PullMessageResponse | BaseException) -> None:
            conn.send(self._pull_reply(cmd, req, result))

        self.broker.pull_message_async(req, done)
        return DEFERRED

    def _pull_reply(
        self, cmd: RemotingCommand, req: PullMessageRequest, result: PullMessageResponse | BaseException
    ) -> RemotingCommand:
        if isinstance(result, BaseException):
            code = getattr(result, "code", ResponseCode.SYSTEM_ERROR)
            if code == ResponseCode.SYSTEM_ERROR:
                log.error("pull %s:%d failed", req.topic, req.queue_id, exc_info=result)
            return cmd.reply(int(code), str(result))
        code = int(result.code)
        body = b"".join(result.records)
        if code == ResponseCode.SUCCESS and body:
            try:
                body = with_store_host(body, self.address)
            except RecordError as exc:
                log.error("pull %s:%d: unservable records: %s", req.topic, req.queue_id, exc)
                return cmd.reply(ResponseCode.SYSTEM_ERROR, str(exc))
        elif code == ResponseCode.SUCCESS:
            code = ResponseCode.PULL_RETRY_IMMEDIATELY  # G10: SUCCESS with no body crashes the C++ client
        else:
            body = b""
        return cmd.reply(
            code,
            result.remark or None,
            {
                "suggestWhichBrokerId": result.suggest_which_broker_id,
                "nextBeginOffset": result.next_begin_offset,
                "minOffset": result.min_offset,
                "maxOffset": result.max_offset,
            },
            body,
        )

    # -- clients --

    def heartbeat(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        data = bodies.parse_heartbeat(cmd.body)
        if conn.client_id != data.client_id:
            conn.client_id = data.client_id
            log.info("connection %s is client %s", conn.peer, data.client_id)
        channel = self.channels.get(data.client_id)
        if channel is None or channel.conn is not conn:
            channel = ConnectionChannel(conn, encode_message_ext)
            self.channels[data.client_id] = channel
        self.broker.heartbeat(data, channel)
        return cmd.reply(ResponseCode.SUCCESS)

    def unregister_client(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        client_id = f.text("clientID")
        self.broker.unregister_client(
            client_id, f.opt("producerGroup") or None, f.opt("consumerGroup") or None
        )
        return cmd.reply(ResponseCode.SUCCESS)

    def get_consumer_list(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        ids = self.broker.get_consumer_list_by_group(Fields(cmd.ext_fields).text("consumerGroup"))
        if not ids:
            return cmd.reply(ResponseCode.SYSTEM_ERROR, "no consumer for this group")
        return cmd.reply(ResponseCode.SUCCESS, body=bodies.dump_json({"consumerIdList": ids}))

    def check_client_config(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        group, client_id, sub = bodies.parse_check_client(cmd.body)
        if sub is not None:
            self.broker.check_client_config(group, client_id, sub)
        return cmd.reply(ResponseCode.SUCCESS)

    # -- offsets --

    def query_consumer_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        offset = self.broker.query_consumer_offset(f.text("consumerGroup"), f.text("topic"), f.num("queueId"))
        if offset is None:
            return cmd.reply(ResponseCode.QUERY_NOT_FOUND, "Not found, maybe this group consumer boot first")
        return cmd.reply(ResponseCode.SUCCESS, ext_fields={"offset": offset})

    def update_consumer_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        self.broker.update_consumer_offset(
            f.text("consumerGroup"), f.text("topic"), f.num("queueId"), f.num("commitOffset")
        )
        return cmd.reply(ResponseCode.SUCCESS)

    def get_max_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        return cmd.reply(
            0, ext_fields={"offset": self.broker.get_max_offset(f.text("topic"), f.num("queueId"))}
        )

    def get_min_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        return cmd.reply(
            0, ext_fields={"offset": self.broker.get_min_offset(f.text("topic"), f.num("queueId"))}
        )

    def search_offset_by_timestamp(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        offset = self.broker.search_offset_by_timestamp(f.text("topic"), f.num("queueId"), f.num("timestamp"))
        return cmd.reply(0, ext_fields={"offset": offset})

    def get_earliest_msg_store_time(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        ts = self.broker.get_earliest_msg_store_time(f.text("topic"), f.num("queueId"))
        return cmd.reply(0, ext_fields={"timestamp": ts})

    def connection_closed(self, conn: Connection) -> None:
        """A client's socket closed (a killed process): the broker forgets it now, so its queues are
        rebalanced at once instead of after the 120 s heartbeat expiry."""
        if conn.client_id is None:
            return
        channel = self.channels.get(conn.client_id)
        if channel is not None and channel.conn is conn:
            del self.channels[conn.client_id]
            self.broker.client_channel_closed(conn.client_id)

    # -- messages --

    def view_message_by_id(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        offset = Fields(cmd.ext_fields).num("offset")
        msg = self.broker.view_message_by_id(encode_offset_msg_id(self.address, offset))
        msg.store_host = self.address
        return cmd.reply(ResponseCode.SUCCESS, body=encode_message_ext(msg))

    def consumer_send_msg_back(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        max_rt = f.opt("maxReconsumeTimes")
        self.broker.consumer_send_msg_back(
            ConsumerSendMsgBackRequest(
                group=f.text("group"),
                offset=f.num("offset"),
                delay_level=f.num("delayLevel", 0),
                origin_msg_id=f.opt("originMsgId") or None,
                origin_topic=f.opt("originTopic") or None,
                unit_mode=f.flag("unitMode"),
                max_reconsume_times=int(max_rt) if max_rt not in (None, "") else None,
            )
        )
        return cmd.reply(ResponseCode.SUCCESS)

    def end_transaction(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        try:
            kind = TransactionType(f.num("commitOrRollback"))
        except ValueError:
            return cmd.reply(ResponseCode.SYSTEM_ERROR, "commitOrRollback must be 0, 8 or 12")
        self.broker.end_transaction(
            EndTransactionRequest(
                producer_group=f.text("producerGroup"),
                msg_id=f.text("msgId"),
                transaction_id=f.opt("transactionId") or None,
                tran_state_table_offset=f.num("tranStateTableOffset", 0),
                commit_log_offset=f.num("commitLogOffset"),
                commit_or_rollback=kind,
                from_transaction_check=f.flag("fromTransactionCheck"),
            )
        )
        return cmd.reply(ResponseCode.SUCCESS)

    # -- orderly locks --

    def lock_batch_mq(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        group, client_id, mqs = bodies.parse_lock_body(cmd.body)
        locked = self.broker.lock_batch_mq(group, client_id, mqs)
        body = bodies.dump_json({"lockOKMQSet": [bodies.mq_to_json(m) for m in sorted(locked)]})
        return cmd.reply(ResponseCode.SUCCESS, body=body)

    def unlock_batch_mq(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        group, client_id, mqs = bodies.parse_lock_body(cmd.body)
        self.broker.unlock_batch_mq(group, client_id, mqs)
        return cmd.reply(ResponseCode.SUCCESS)


__all__ = ["BrokerApi", "BrokerHandlers", "ConnectionChannel", "encode_message_ext", "properties_to_string"]
