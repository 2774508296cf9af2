"""Between 5.x protobuf messages and broker_sim's stored messages (4.x properties).

A 5.x message's system properties map onto the 4.x property names the store and the 4.x clients already
use, so a message crosses front ends unchanged: ``message_id`` ↔ ``UNIQ_KEY``, ``keys`` ↔ ``KEYS``
(space-joined), ``tag`` ↔ ``TAGS``, ``message_group`` ↔ ``__SHARDINGKEY`` (RocketMQ 5's name for it);
user properties travel as they are. Delivery timestamps are handled by :mod:`.timer`, transactions by the
Broker's half-message path (``TRAN_MSG`` + ``PGROUP``).
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Mapping
from typing import Any

from broker_sim.broker.api import SendMessageRequest
from broker_sim.client.message import MessageExt, Prop, SysFlag
from broker_sim.grpc.pop import MESSAGE_GROUP, Delivery
from broker_sim.grpc.protocol import Protocol

#: producer group under which 5.x producers of a topic are registered (5.x has no producer groups; the
#: check-back of a half message goes to a live 5.x producer of its topic)
PRODUCER_GROUP_PREFIX = "GRPC_PRODUCER_"
#: property holding the delivery time (ms) of a 5.x delay message while it waits in the timer topic
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
_IPV4 = re.compile(r"(\d{1,3}\.){3}\d{1,3}")
_SYSTEM = frozenset(
    {Prop.UNIQ_KEY, Prop.KEYS, Prop.TAGS, MESSAGE_GROUP, Prop.TRAN_MSG, Prop.PRODUCER_GROUP, Prop.REAL_TOPIC,
     Prop.REAL_QID, Prop.TRANSACTION_CHECK_TIMES, Prop.CLUSTER, TIMER_DELIVER_MS, "MSG_TYPE"}
)  # fmt: skip


def producer_group(topic: str) -> str:
    return PRODUCER_GROUP_PREFIX + topic


def _ms(ts: Any) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def _set_ms(ts: Any, ms: int) -> None:
    ts.seconds, ts.nanos = divmod(ms, 1000)[0], (ms % 1000) * 1_000_000


#: user property names a 5.x proxy refuses ("property is used by system"): the 4.x system properties
RESERVED_USER_PROPERTIES = frozenset(
    {v for k, v in vars(Prop).items() if not k.startswith("_") and isinstance(v, str)}
    | _SYSTEM
    | {"__STARTDELIVERTIME", "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "TRACE_ON", "MSG_REGION", "BUYER_ID",
       "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "TRAN_PREPARED_QUEUE_OFFSET", "INNER_NUM",
       "INNER_BASE"}
)  # fmt: skip


class IllegalPropertyError(ValueError):
    """A user property the broker keeps for itself, or one its format cannot carry."""


def check_user_properties(props: Mapping[str, str]) -> None:
    """Refuse what a 5.x proxy refuses: a system property's name (``KEYS`` replaced the message's keys,
    ``DELAY`` parked it for hours, ``__SHARDINGKEY`` made it FIFO — each silently) and the 4.x property
    separators ``\\x01``/``\\x02`` in a name or value (they would split into other properties)."""
    for key, value in props.items():
        if key in RESERVED_USER_PROPERTIES:
            raise IllegalPropertyError(f"property {key!r} is used by system")
        if any(c in key or c in value for c in ("\x01", "\x02")):
            raise IllegalPropertyError(f"property {key!r} contains a property separator")


def to_send_request(pb: Protocol, msg: Any, queue_id: int) -> tuple[SendMessageRequest, bytes, int | None]:
    """A protobuf ``Message`` → (broker request, body, delivery time in ms or None)."""
    sp = msg.system_properties
    props: dict[str, str] = dict(msg.user_properties)
    check_user_properties(props)
    props[Prop.UNIQ_KEY] = sp.message_id
    if sp.tag:
        props[Prop.TAGS] = sp.tag
    if sp.keys:
        props[Prop.KEYS] = " ".join(sp.keys)
    if sp.message_group:
        props[MESSAGE_GROUP] = sp.message_group
    sys_flag = 0
    if sp.message_type == pb.definition.TRANSACTION:
        sys_flag = SysFlag.TRANSACTION_PREPARED
        props[Prop.TRAN_MSG] = "true"
        props[Prop.PRODUCER_GROUP] = producer_group(msg.topic.name)
    deliver_ms = _ms(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else None
    host = sp.born_host if _IPV4.fullmatch(sp.born_host or "") else "127.0.0.1"  # the store keeps IPv4 hosts
    req = SendMessageRequest(
        producer_group=producer_group(msg.topic.name), topic=msg.topic.name, queue_id=queue_id,
        properties=props, sys_flag=sys_flag, born_timestamp=_ms(sp.born_timestamp), born_host=f"{host}:0",
    )  # fmt: skip
    body = bytes(msg.body)
    if sp.body_encoding == pb.definition.GZIP:
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError) as exc:
            raise ValueError(f"message {sp.message_id}: body is not valid gzip ({exc})") from exc
    return req, body, deliver_ms


def message_type(pb: Protocol, ext: MessageExt) -> int:
    if ext.sys_flag & SysFlag.TRANSACTION_MASK == SysFlag.TRANSACTION_COMMIT:
        return int(pb.definition.TRANSACTION)
    if MESSAGE_GROUP in ext.properties:
        return int(pb.definition.FIFO)
    if TIMER_DELIVER_MS in ext.properties:
        return int(pb.definition.DELAY)
    return int(pb.definition.NORMAL)


def to_pb_message(pb: Protocol, ext: MessageExt, delivery: Delivery | None = None) -> Any:
    """A stored message as the protobuf ``Message`` a 5.x client decodes (body digest included)."""
    d = pb.definition
    m = d.Message()
    m.topic.name = ext.topic
    m.body = ext.body
    for k, v in ext.properties.items():
        if k not in _SYSTEM:
            m.user_properties[k] = v
    sp = m.system_properties
    sp.message_id = ext.msg_id
    if ext.tags:
        sp.tag = ext.tags
    sp.keys.extend(ext.key_list)
    sp.body_digest.type = d.CRC32
    sp.body_digest.checksum = format(zlib.crc32(ext.body) & 0xFFFFFFFF, "08X")
    sp.body_encoding = d.IDENTITY
    sp.message_type = message_type(pb, ext)
    _set_ms(sp.born_timestamp, ext.born_timestamp)
    sp.born_host = ext.born_host.rsplit(":", 1)[0]
    _set_ms(sp.store_timestamp, ext.store_timestamp)
    sp.store_host = ext.store_host
    sp.queue_id = ext.queue_id
    sp.queue_offset = ext.queue_offset
    group = ext.properties.get(MESSAGE_GROUP)
    if group:
        sp.message_group = group
    deliver = ext.properties.get(TIMER_DELIVER_MS)
    if deliver:
        _set_ms(sp.delivery_timestamp, int(deliver))
    if delivery is not None:
        sp.receipt_handle = delivery.handle.encode()
        sp.delivery_attempt = delivery.attempt
        sp.invisible_duration.seconds, ms = divmod(delivery.handle.invisible_ms, 1000)
        sp.invisible_duration.nanos = ms * 1_000_000
    return m
