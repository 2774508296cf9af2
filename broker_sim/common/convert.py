"""Conversions between the store's record types and the client-facing :class:`MessageExt`."""

from __future__ import annotations

from broker_sim.common.message import MessageExt
from broker_sim.store.message_record import MessageExt as StoredMessage
from broker_sim.store.message_record import decode_record, host_bytes, offset_msg_id


def host_str(host: tuple[str, int]) -> str:
    return f"{host[0]}:{host[1]}"


def parse_host(text: str) -> tuple[str, int]:
    """``"ip:port"`` → ``(ip, port)``; anything unparsable becomes ``("127.0.0.1", 0)`` (born host is
    advisory)."""
    host, _, port = text.rpartition(":")
    try:
        return (host or "127.0.0.1"), int(port)
    except ValueError:
        return "127.0.0.1", 0


def to_client(ext: StoredMessage, broker_name: str = "") -> MessageExt:
    return MessageExt(
        topic=ext.topic,
        body=ext.body,
        flag=ext.flag,
        properties=dict(ext.properties),
        queue_id=ext.queue_id,
        queue_offset=ext.queue_offset,
        commit_log_offset=ext.commit_log_offset,
        store_size=ext.store_size,
        sys_flag=ext.sys_flag,
        body_crc=ext.body_crc,
        born_timestamp=ext.born_timestamp,
        born_host=host_str(ext.born_host),
        store_timestamp=ext.store_timestamp,
        store_host=host_str(ext.store_host),
        reconsume_times=ext.reconsume_times,
        prepared_transaction_offset=ext.prepared_transaction_offset,
        offset_msg_id=offset_msg_id(host_bytes(ext.store_host), ext.commit_log_offset),
        broker_name=broker_name,
    )


def record_to_client(raw: bytes, broker_name: str = "") -> MessageExt:
    return to_client(decode_record(raw), broker_name)
