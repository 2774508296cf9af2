"""broker_sim's storage engine: RocketMQ 4.x's commit log, consume queues, index file, checkpoint, flush,
recovery and expiry, byte for byte. The messaging layer uses :class:`MessageStore`."""

from __future__ import annotations

from broker_sim.store import config_files
from broker_sim.store.config import SCHEDULE_TOPIC, TRANS_HALF_TOPIC, FlushDiskType, StoreConfig
from broker_sim.store.errors import (
    ConfigFileError,
    CorruptRecordError,
    MessageIllegalError,
    PropertiesSizeExceededError,
    StoreError,
    StoreLayoutError,
    StoreNotRunningError,
)
from broker_sim.store.message_record import (
    MessageExt,
    MessageInner,
    decode_msg_id,
    decode_properties,
    decode_record,
    encode_properties,
    encode_record,
    java_string_hash,
    offset_msg_id,
    tags_hash,
)
from broker_sim.store.message_store import MessageStore
from broker_sim.store.results import (
    AppendMessageResult,
    AppendMessageStatus,
    DispatchRequest,
    ExpiryReport,
    GetMessageResult,
    GetMessageStatus,
    MessageFilter,
    PutMessageResult,
    PutMessageStatus,
    QueryMessageResult,
    RecoveryReport,
    SelectedMessage,
)

__all__ = [
    "SCHEDULE_TOPIC",
    "TRANS_HALF_TOPIC",
    "AppendMessageResult",
    "AppendMessageStatus",
    "ConfigFileError",
    "CorruptRecordError",
    "DispatchRequest",
    "ExpiryReport",
    "FlushDiskType",
    "GetMessageResult",
    "GetMessageStatus",
    "MessageExt",
    "MessageFilter",
    "MessageIllegalError",
    "MessageInner",
    "MessageStore",
    "PropertiesSizeExceededError",
    "PutMessageResult",
    "PutMessageStatus",
    "QueryMessageResult",
    "RecoveryReport",
    "SelectedMessage",
    "StoreConfig",
    "StoreError",
    "StoreLayoutError",
    "StoreNotRunningError",
    "config_files",
    "decode_msg_id",
    "decode_properties",
    "decode_record",
    "encode_properties",
    "encode_record",
    "java_string_hash",
    "offset_msg_id",
    "tags_hash",
]
