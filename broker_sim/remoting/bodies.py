"""JSON and binary request/reply bodies (reference §D and §F), shared by the server and the TCP client.

Parsing is tolerant where real clients differ (enum values as integers from C++, as names from Java's
fastjson; map keys quoted or not) and strict where a wrong value would silently change behaviour: anything
unparseable is a :class:`~broker_sim.remoting.errors.HeaderFieldError`, answered with SYSTEM_ERROR.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from enum import IntEnum
from typing import Any, TypeVar

from broker_sim.common.message import MessageQueue, properties_to_string, string_to_properties
from broker_sim.common.requests import (
    BatchEntry,
    BrokerData,
    ConsumeFromWhere,
    ConsumerData,
    ConsumeType,
    ExpressionType,
    HeartbeatData,
    MessageModel,
    QueueData,
    SubscriptionData,
    TopicRouteData,
)
from broker_sim.remoting.errors import HeaderFieldError

E = TypeVar("E", bound=IntEnum)


def load_json(body: bytes, what: str) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise HeaderFieldError(f"{what} body is not valid JSON: {exc}") from None


def dump_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def _enum(cls: type[E], value: Any, default: E) -> E:
    if value is None:
        return default
    try:
        if isinstance(value, str) and not value.lstrip("-").isdigit():
            return cls[value]
        return cls(int(value))
    except (KeyError, ValueError):
        raise HeaderFieldError(f"{cls.__name__} value {value!r} is unknown") from None


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise HeaderFieldError(f"{what} is not a JSON object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []  # the C++ client leaves empty sets out
    if not isinstance(value, list):
        raise HeaderFieldError(f"{what} is not a JSON array")
    return value


def expression_type(value: Any) -> ExpressionType:
    """``expressionType`` of a subscription or pull (absent: TAG, as older clients send none)."""
    if value in (None, ""):
        return ExpressionType.TAG
    try:
        return ExpressionType(str(value).upper())
    except ValueError:
        raise HeaderFieldError(f"expressionType {value!r} is unknown (TAG or SQL92)") from None


# -- heartbeat --


def parse_heartbeat(body: bytes) -> HeartbeatData:
    obj = _obj(load_json(body, "HEART_BEAT"), "HEART_BEAT body")
    client_id = obj.get("clientID")
    if not isinstance(client_id, str) or not client_id:
        raise HeaderFieldError("HEART_BEAT body lacks clientID")
    consumers = []
    for c in _list(obj.get("consumerDataSet"), "consumerDataSet"):
        c = _obj(c, "consumerData")
        subs = tuple(
            SubscriptionData(
                topic=str(_obj(s, "subscriptionData").get("topic", "")),
                sub_string=str(s.get("subString") or "*"),
                sub_version=int(s.get("subVersion") or 0),
                expression_type=expression_type(s.get("expressionType")),
            )
            for s in _list(c.get("subscriptionDataSet"), "subscriptionDataSet")
        )
        consumers.append(
            ConsumerData(
                group_name=str(c.get("groupName", "")),
                consume_type=_enum(ConsumeType, c.get("consumeType"), ConsumeType.CONSUME_PASSIVELY),
                message_model=_enum(MessageModel, c.get("messageModel"), MessageModel.CLUSTERING),
                consume_from_where=_enum(
                    ConsumeFromWhere, c.get("consumeFromWhere"), ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
                ),
                subscriptions=subs,
                unit_mode=bool(c.get("unitMode", False)),
            )
        )
    producers = tuple(
        str(_obj(p, "producerData").get("groupName", ""))
        for p in _list(obj.get("producerDataSet"), "producerDataSet")
    )
    return HeartbeatData(client_id=client_id, producer_groups=producers, consumers=tuple(consumers))


def heartbeat_body(data: HeartbeatData) -> bytes:
    """The body in the C++ client's shape (enums as integers, empty sets left out)."""
    obj: dict[str, Any] = {"clientID": data.client_id}
    if data.consumers:
        obj["consumerDataSet"] = [
            {
                "groupName": c.group_name,
                "consumeType": int(c.consume_type),
                "messageModel": int(c.message_model),
                "consumeFromWhere": int(c.consume_from_where),
                "unitMode": c.unit_mode,
                "subscriptionDataSet": [
                    {
                        "topic": s.topic,
                        "subString": s.sub_string,
                        "subVersion": str(s.sub_version),
                        "expressionType": str(s.expression_type),
                    }
                    for s in c.subscriptions
                ],
            }
            for c in data.consumers
        ]
    if data.producer_groups:
        obj["producerDataSet"] = [{"groupName": g} for g in data.producer_groups]
    return dump_json(obj)


# -- CHECK_CLIENT_CONFIG (46) --


def check_client_body(group: str, client_id: str, sub: SubscriptionData) -> bytes:
    """``CheckClientRequestBody``: the client, its group and one subscription."""
    return dump_json(
        {
            "clientId": client_id,
            "group": group,
            "subscriptionData": {
                "topic": sub.topic,
                "subString": sub.sub_string,
                "subVersion": sub.sub_version,
                "expressionType": str(sub.expression_type),
            },
        }
    )


def parse_check_client(body: bytes) -> tuple[str, str, SubscriptionData | None]:
    if not body:
        return "", "", None
    obj = _obj(load_json(body, "CHECK_CLIENT_CONFIG"), "CHECK_CLIENT_CONFIG body")
    raw = obj.get("subscriptionData")
    if raw is None:
        return str(obj.get("group", "")), str(obj.get("clientId", "")), None
    s = _obj(raw, "subscriptionData")
    sub = SubscriptionData(
        topic=str(s.get("topic", "")),
        sub_string=str(s.get("subString") or "*"),
        sub_version=int(s.get("subVersion") or 0),
        expression_type=expression_type(s.get("expressionType")),
    )
    return str(obj.get("group", "")), str(obj.get("clientId", "")), sub


# -- RESET_CONSUMER_CLIENT_OFFSET (220) --


def reset_offset_body(offsets: dict[MessageQueue, int]) -> bytes:
    """``ResetOffsetBody`` as a list of rows (Java's map is keyed by MessageQueue objects: not JSON)."""
    rows = [
        {"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": off}
        for mq, off in sorted(offsets.items())
    ]
    return dump_json({"offsetTable": rows})


def parse_reset_offset(body: bytes) -> dict[MessageQueue, int]:
    obj = _obj(load_json(body, "RESET_CONSUMER_CLIENT_OFFSET"), "ResetOffsetBody")
    out: dict[MessageQueue, int] = {}
    for row in _list(obj.get("offsetTable"), "offsetTable"):
        r = _obj(row, "offsetTable row")
        try:
            out[MessageQueue(str(r["topic"]), str(r["brokerName"]), int(r["queueId"]))] = int(r["offset"])
        except (KeyError, TypeError, ValueError) as exc:
            raise HeaderFieldError(f"bad offsetTable row {r!r}: {exc}") from None
    return out


# -- routes --


def route_to_json(route: TopicRouteData) -> dict[str, Any]:
    return {
        "orderTopicConf": route.order_topic_conf,
        "queueDatas": [
            {
                "brokerName": q.broker_name,
                "readQueueNums": q.read_queue_nums,
                "writeQueueNums": q.write_queue_nums,
                "perm": q.perm,
                "topicSysFlag": q.topic_sys_flag,
            }
            for q in route.queue_datas
        ],
        "brokerDatas": [
            {
                "cluster": b.cluster,
                "brokerName": b.broker_name,
                "brokerAddrs": {str(k): v for k, v in b.broker_addrs.items()},
            }
            for b in route.broker_datas
        ],
        "filterServerTable": {},
    }


def parse_route(body: bytes) -> TopicRouteData:
    obj = _obj(load_json(body, "route"), "TopicRouteData")
    try:
        return TopicRouteData(
            queue_datas=[
                QueueData(
                    broker_name=str(q["brokerName"]),
                    read_queue_nums=int(q["readQueueNums"]),
                    write_queue_nums=int(q["writeQueueNums"]),
                    perm=int(q["perm"]),
                    topic_sys_flag=int(q.get("topicSysFlag", 0)),
                )
                for q in _list(obj.get("queueDatas"), "queueDatas")
            ],
            broker_datas=[
                BrokerData(
                    cluster=str(b.get("cluster", "")),
                    broker_name=str(b["brokerName"]),
                    broker_addrs={int(k): str(v) for k, v in _obj(b["brokerAddrs"], "brokerAddrs").items()},
                )
                for b in _list(obj.get("brokerDatas"), "brokerDatas")
            ],
            order_topic_conf=obj.get("orderTopicConf"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise HeaderFieldError(f"TopicRouteData is malformed: {exc!r}") from None


# -- queue locks --


def mq_to_json(mq: MessageQueue) -> dict[str, Any]:
    return {"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id}


def mq_from_json(obj: Any) -> MessageQueue:
    o = _obj(obj, "MessageQueue")
    try:
        return MessageQueue(str(o["topic"]), str(o["brokerName"]), int(o["queueId"]))
    except (KeyError, ValueError) as exc:
        raise HeaderFieldError(f"MessageQueue is malformed: {exc!r}") from None


def parse_lock_body(body: bytes) -> tuple[str, str, set[MessageQueue]]:
    obj = _obj(load_json(body, "LOCK/UNLOCK_BATCH_MQ"), "lock body")
    group, client = obj.get("consumerGroup"), obj.get("clientId")
    if not isinstance(group, str) or not isinstance(client, str):
        raise HeaderFieldError("lock body lacks consumerGroup/clientId")
    return group, client, {mq_from_json(m) for m in _list(obj.get("mqSet"), "mqSet")}


def lock_body(group: str, client_id: str, mqs: set[MessageQueue]) -> bytes:
    return dump_json(
        {"consumerGroup": group, "clientId": client_id, "mqSet": [mq_to_json(m) for m in sorted(mqs)]}
    )


# -- batch body (§F) --
#
#   per message:  0 TOTALSIZE i32 | 4 MAGIC i32 (0) | 8 BODYCRC i32 (0) | 12 FLAG i32 | 16 BODYLEN i32 |
#                 20 body | PROPLEN i16 | properties         TOTALSIZE = 20 + bodyLen + 2 + propLen
_BATCH_HEAD = struct.Struct(">iiiii")


def encode_batch(entries: Sequence[BatchEntry]) -> bytes:
    out = bytearray()
    for e in entries:
        props = properties_to_string(e.properties).encode("utf-8")
        out += _BATCH_HEAD.pack(20 + len(e.body) + 2 + len(props), 0, 0, e.flag, len(e.body))
        out += e.body + struct.pack(">h", len(props)) + props
    return bytes(out)


def decode_batch(body: bytes) -> list[BatchEntry]:
    entries: list[BatchEntry] = []
    pos = 0
    while pos < len(body):
        if len(body) - pos < _BATCH_HEAD.size + 2:
            raise HeaderFieldError(f"batch body: truncated message header at {pos}")
        total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(body, pos)
        if body_len < 0 or total < 22 + body_len or total > len(body) - pos:
            raise HeaderFieldError(f"batch body: message at {pos} has inconsistent lengths")
        p = pos + _BATCH_HEAD.size
        msg_body = body[p : p + body_len]
        (prop_len,) = struct.unpack_from(">h", body, p + body_len)
        if prop_len < 0 or total != 22 + body_len + prop_len:
            raise HeaderFieldError(f"batch body: message at {pos} has inconsistent properties length")
        raw_props = body[p + body_len + 2 : p + body_len + 2 + prop_len]
        try:
            props = string_to_properties(raw_props.decode("utf-8"))
        except UnicodeDecodeError:
            raise HeaderFieldError(f"batch body: properties of message at {pos} are not UTF-8") from None
        entries.append(BatchEntry(body=bytes(msg_body), properties=props, flag=flag))
        pos += total
    if not entries:
        raise HeaderFieldError("batch body holds no message")
    return entries


__all__ = [
    "decode_batch",
    "encode_batch",
    "heartbeat_body",
    "lock_body",
    "parse_heartbeat",
    "parse_lock_body",
    "parse_route",
    "route_to_json",
    "string_to_properties",
]
