"""``broker-sim admin``: mqadmin-style commands against a running ``broker-sim serve``.

Everything goes over the wire (name server, then broker) with :class:`AdminClient`, so the commands work
against any broker-sim reachable on the network and exercise the same protocol clients use.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from broker_sim.common.errors import error_for_code
from broker_sim.common.message import MessageExt, MessageQueue
from broker_sim.common.requests import QueueProgress, ResponseCode
from broker_sim.remoting import bodies
from broker_sim.remoting.admin_handlers import READ_QUEUE
from broker_sim.remoting.client_transport import RemotingTransport
from broker_sim.remoting.codes import RequestCode
from broker_sim.remoting.records import decode_records

DLQ_PREFIX = "%DLQ%"
ADMIN_GROUP = "broker_sim_admin"


class AdminClient:
    """Admin requests (topic create/list, consume stats, query by key) on top of a RemotingTransport."""

    def __init__(self, namesrv: str) -> None:
        self.transport = RemotingTransport(namesrv, request_timeout_ms=5000)

    def close(self) -> None:
        self.transport.close()

    def _broker_call(self, code: int, fields: dict[str, Any], body: bytes = b"") -> Any:
        t = self.transport
        reply = t._invoke(t._broker(), t._req(code, fields, body))
        if reply.code != ResponseCode.SUCCESS:
            raise error_for_code(reply.code, reply.remark or f"request {code} failed with code {reply.code}")
        return reply

    def create_topic(self, name: str, queues: int, perm: int) -> None:
        fields = {
            "topic": name,
            "defaultTopic": "TBW102",
            "readQueueNums": queues,
            "writeQueueNums": queues,
            "perm": perm,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": False,
        }
        self._broker_call(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)

    def topic_list(self) -> list[str]:
        t = self.transport
        reply = t._ok(t._invoke(t.address, t._req(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)))
        return [str(x) for x in bodies.load_json(reply.body, "topic list").get("topicList", [])]

    def route(self, topic: str) -> dict[str, Any]:
        return bodies.route_to_json(self.transport.get_route(topic))

    def consumer_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        reply = self._broker_call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": group, "topic": topic})
        rows = bodies.load_json(reply.body, "consume stats").get("offsetTable", [])
        return [
            QueueProgress(
                queue=MessageQueue(r["topic"], r["brokerName"], int(r["queueId"])),
                broker_offset=int(r["brokerOffset"]),
                consumer_offset=int(r["consumerOffset"]),
                last_timestamp=int(r.get("lastTimestamp", 0)),
            )
            for r in rows
        ]

    def query_by_key(self, topic: str, key: str, max_num: int) -> list[MessageExt]:
        fields = {
            "topic": topic,
            "key": key,
            "maxNum": max_num,
            "beginTimestamp": 0,
            "endTimestamp": int(time.time() * 1000) + 60_000,
        }
        t = self.transport
        reply = t._invoke(t._broker(), t._req(RequestCode.QUERY_MESSAGE, fields))
        if reply.code == ResponseCode.QUERY_NOT_FOUND:
            return []
        t._ok(reply)
        return decode_records(reply.body) if reply.body else []

    def view(self, msg_id: str) -> MessageExt:
        return self.transport.view_message_by_id(msg_id)

    def read_queue(self, topic: str, queue_id: int, max_num: int) -> list[MessageExt]:
        """Messages of one queue from its start, ignoring permissions and consumer offsets (READ_QUEUE)."""
        fields = {"topic": topic, "queueId": queue_id, "offset": 0, "maxNum": max_num}
        reply = self._broker_call(READ_QUEUE, fields)
        return decode_records(reply.body) if reply.body else []


def _message_row(m: MessageExt) -> dict[str, Any]:
    return {
        "offsetMsgId": m.offset_msg_id,
        "msgId": m.msg_id,
        "topic": m.topic,
        "queueId": m.queue_id,
        "queueOffset": m.queue_offset,
        "keys": m.properties.get("KEYS", ""),
        "tags": m.properties.get("TAGS", ""),
        "reconsumeTimes": m.reconsume_times,
        "retryTopic": m.properties.get("RETRY_TOPIC", ""),
        "storeTimestamp": m.store_timestamp,
        "body": m.body[:200].decode("utf-8", "replace"),
    }


def _print(
    args: argparse.Namespace, rows: list[dict[str, Any]] | dict[str, Any], columns: list[str] | None = None
) -> None:
    if args.json or isinstance(rows, dict):
        print(json.dumps(rows, indent=2 if isinstance(rows, dict) else None))
        return
    cols = columns or (list(rows[0]) if rows else [])
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) if rows else len(c) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols))


def run_admin(args: argparse.Namespace) -> int:
    admin = AdminClient(args.namesrv)
    try:
        if args.area == "topic":
            if args.action == "create":
                if args.queues < 1 or args.queues > 1024:
                    raise ValueError("--queues must be between 1 and 1024")
                admin.create_topic(args.name, args.queues, args.perm)
                print(f"created {args.name} with {args.queues} queues (perm {args.perm})")
            elif args.action == "list":
                _print(args, [{"topic": t} for t in admin.topic_list()], ["topic"])
            else:
                _print(args, admin.route(args.name))
        elif args.area == "consumer":
            progress = admin.consumer_progress(args.group, args.topic)
            rows: list[dict[str, Any]] = [
                {
                    "topic": p.queue.topic,
                    "broker": p.queue.broker_name,
                    "queue": p.queue.queue_id,
                    "brokerOffset": p.broker_offset,
                    "consumerOffset": p.consumer_offset,
                    "lag": p.lag,
                }
                for p in progress
            ]
            _print(args, rows, ["topic", "broker", "queue", "brokerOffset", "consumerOffset", "lag"])
            if not args.json:
                print(f"total lag: {sum(p.lag for p in progress)}")
        elif args.area == "message":
            if args.action == "query":
                _print(args, [_message_row(m) for m in admin.query_by_key(args.topic, args.key, args.max)])
            else:
                _print(args, _message_row(admin.view(args.id)))
        else:
            groups = [t[len(DLQ_PREFIX) :] for t in admin.topic_list() if t.startswith(DLQ_PREFIX)]
            if args.group:
                groups = [g for g in groups if g == args.group]
            rows = []
            for g in sorted(groups):
                rows += [
                    dict(_message_row(m), group=g) for m in admin.read_queue(DLQ_PREFIX + g, 0, args.max)
                ]
            _print(
                args, rows, ["group", "msgId", "offsetMsgId", "retryTopic", "reconsumeTimes", "keys", "body"]
            )
        return 0
    finally:
        admin.close()
