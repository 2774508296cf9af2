"""Broker-side admin requests (what ``mqadmin`` and ``broker-sim admin`` send).

Replies follow Java's shapes where a client would parse them (UPDATE_AND_CREATE_TOPIC, QUERY_MESSAGE's
record body, GET_ALL_TOPIC_CONFIG's ``topicConfigTable``). GET_CONSUME_STATS uses a simpler body than
Java's (whose ``offsetTable`` has JSON objects as map keys): a list of rows, read only by our admin client.
READ_QUEUE (9001) is a broker_sim extension: it reads any queue without a consumer group or permissions,
which is how ``dlq list`` shows ``%DLQ%`` topics without a consumer group of its own.
"""

from __future__ import annotations

from typing import Any, Protocol

from broker_sim.common.message import MessageExt
from broker_sim.common.requests import QueueProgress
from broker_sim.remoting import bodies
from broker_sim.remoting.codes import RequestCode, ResponseCode
from broker_sim.remoting.connection_channel import encode_message_ext
from broker_sim.remoting.frame import RemotingCommand
from broker_sim.remoting.header import Fields
from broker_sim.remoting.server import Connection, Handler

READ_QUEUE = 9001  # broker_sim extension, see the module docstring


class AdminApi(Protocol):
    def create_topic(
        self,
        topic: str,
        queue_nums: int = 8,
        *,
        read_queue_nums: int | None = None,
        write_queue_nums: int | None = None,
        perm: int = 6,
        order: bool = False,
    ) -> Any: ...

    def topic_list(self) -> list[Any]: ...

    def consumer_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]: ...

    def query_message_by_key(self, topic: str, key: str, max_num: int = 64) -> list[MessageExt]: ...

    def messages(
        self, topic: str, queue_id: int = 0, offset: int = 0, max_num: int = 10_000
    ) -> list[MessageExt]: ...


class AdminHandlers:
    def __init__(self, broker: AdminApi, address: str) -> None:
        self.broker = broker
        self.address = address

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.create_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.all_topic_config,
            RequestCode.GET_CONSUME_STATS: self.consume_stats,
            RequestCode.QUERY_MESSAGE: self.query_message,
            READ_QUEUE: self.read_queue,
        }

    def _records(self, messages: list[MessageExt]) -> bytes:
        out = []
        for m in messages:
            m.store_host = self.address  # G7, as for pulls
            out.append(encode_message_ext(m))
        return b"".join(out)

    def create_topic(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        read, write = f.num("readQueueNums", 8), f.num("writeQueueNums", 8)
        if not (0 < read <= 1024 and 0 < write <= 1024):
            return cmd.reply(ResponseCode.SYSTEM_ERROR, "queue counts must be between 1 and 1024")
        self.broker.create_topic(
            f.text("topic"),
            read_queue_nums=read,
            write_queue_nums=write,
            perm=f.num("perm", 6),
            order=f.flag("order"),
        )
        return cmd.reply(ResponseCode.SUCCESS)

    def all_topic_config(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        table = {
            tc.topic_name: {
                "topicName": tc.topic_name,
                "readQueueNums": tc.read_queue_nums,
                "writeQueueNums": tc.write_queue_nums,
                "perm": tc.perm,
                "topicSysFlag": tc.topic_sys_flag,
                "order": tc.order,
            }
            for tc in self.broker.topic_list()
        }
        return cmd.reply(ResponseCode.SUCCESS, body=bodies.dump_json({"topicConfigTable": table}))

    def consume_stats(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        rows = [
            {
                "topic": p.queue.topic,
                "brokerName": p.queue.broker_name,
                "queueId": p.queue.queue_id,
                "brokerOffset": p.broker_offset,
                "consumerOffset": p.consumer_offset,
                "lastTimestamp": p.last_timestamp,
            }
            for p in self.broker.consumer_progress(f.text("consumerGroup"), f.opt("topic") or None)
        ]
        return cmd.reply(
            ResponseCode.SUCCESS, body=bodies.dump_json({"offsetTable": rows, "consumeTps": 0.0})
        )

    def query_message(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        found = self.broker.query_message_by_key(f.text("topic"), f.text("key"), f.num("maxNum", 64))
        if not found:
            return cmd.reply(
                ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct"
            )
        ext = {"indexLastUpdateTimestamp": 0, "indexLastUpdatePhyoffset": 0}
        return cmd.reply(ResponseCode.SUCCESS, ext_fields=ext, body=self._records(found))

    def read_queue(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        f = Fields(cmd.ext_fields)
        max_num = min(max(f.num("maxNum", 32), 1), 1000)
        found = self.broker.messages(f.text("topic"), f.num("queueId", 0), f.num("offset", 0), max_num)
        return cmd.reply(ResponseCode.SUCCESS, body=self._records(found))
