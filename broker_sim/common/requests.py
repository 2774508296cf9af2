"""Request and response types of the Broker's request-level API.

Every public request method of :class:`broker_sim.broker.Broker` takes and returns these types, and they
mirror RocketMQ's remoting requests field for field (see ``rocketmq-reference.md`` §C), so the network
server maps each wire request 1:1 onto one Broker call and the in-process client transport calls the same
methods directly. Failures are raised as :class:`broker_sim.common.errors.BrokerResponseError` subclasses
whose ``code`` is the wire response code.

Broker → client requests (CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED) go through the
:class:`ClientChannel` a client passes with its heartbeat: in-process it calls the client object; over TCP the
server implements it by writing a oneway request on the client's connection.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from broker_sim.common.message import MessageExt, MessageQueue


class ResponseCode(enum.IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    CONSUMER_NOT_ONLINE = 206


class Perm(enum.IntFlag):
    INHERIT = 1
    WRITE = 2
    READ = 4
    PRIORITY = 8
    READ_WRITE = 6


class ConsumeType(enum.IntEnum):
    CONSUME_ACTIVELY = 0  # pull consumer
    CONSUME_PASSIVELY = 1  # push consumer


class MessageModel(enum.IntEnum):
    BROADCASTING = 0
    CLUSTERING = 1


class ConsumeFromWhere(enum.IntEnum):
    """Where a new group starts. Values 1–3 are deprecated in RocketMQ 4.9.8 but still part of the enum, so a
    client may send them in its heartbeat; Java's ``RebalancePushImpl.computePullFromWhere`` treats them
    exactly like CONSUME_FROM_LAST_OFFSET, and so does broker_sim."""

    CONSUME_FROM_LAST_OFFSET = 0
    CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST = 1  # deprecated
    CONSUME_FROM_MIN_OFFSET = 2  # deprecated
    CONSUME_FROM_MAX_OFFSET = 3  # deprecated
    CONSUME_FROM_FIRST_OFFSET = 4
    CONSUME_FROM_TIMESTAMP = 5


class ExpressionType(enum.StrEnum):
    """How a subscription's expression is read (``ExpressionType`` in RocketMQ): tags, or SQL92 over
    properties."""

    TAG = "TAG"
    SQL92 = "SQL92"


@dataclass(frozen=True)
class MessageSelector:
    """What to consume from a topic: ``MessageSelector.by_tag("A || B")`` or ``MessageSelector.by_sql("a >
    5")`` (RocketMQ's ``MessageSelector``); a plain string passed to ``subscribe``/``pull`` is a tag
    expression."""

    expression_type: ExpressionType
    expression: str

    @classmethod
    def by_tag(cls, expression: str | None) -> MessageSelector:
        return cls(ExpressionType.TAG, expression or "*")

    @classmethod
    def by_sql(cls, expression: str) -> MessageSelector:
        return cls(ExpressionType.SQL92, expression)

    @classmethod
    def of(cls, expression: str | MessageSelector | None) -> MessageSelector:
        return expression if isinstance(expression, MessageSelector) else cls.by_tag(expression)


class TransactionType(enum.IntEnum):
    """``commitOrRollback`` of END_TRANSACTION (the sysFlag transaction bits)."""

    NOT_TYPE = 0  # unknown: leave the half message for check-back
    COMMIT = 8
    ROLLBACK = 12


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


_PULL_STATUS = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


# -- routes --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@dataclass(frozen=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str]  # brokerId -> "ip:port"; 0 is the master


@dataclass(frozen=True)
class TopicRouteData:
    queue_datas: list[QueueData]
    broker_datas: list[BrokerData]
    order_topic_conf: str | None = None


# -- send ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SendMessageRequest:
    """SEND_MESSAGE (10) / SEND_MESSAGE_V2 (310) header; the body travels separately."""

    producer_group: str
    topic: str
    queue_id: int
    properties: dict[str, str] = field(default_factory=dict)
    sys_flag: int = 0
    born_timestamp: int = 0
    flag: int = 0
    reconsume_times: int = 0
    unit_mode: bool = False
    max_reconsume_times: int | None = None
    batch: bool = False
    default_topic: str = "TBW102"
    default_topic_queue_nums: int = 4
    born_host: str = "127.0.0.1:0"
    #: the broker group of the chosen queue (routing only, not on the wire); "" = the only/any broker
    broker_name: str = ""


@dataclass(frozen=True)
class BatchEntry:
    """One message of a SEND_BATCH_MESSAGE (320) body: flag, body and its own properties."""

    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0


@dataclass(frozen=True)
class SendMessageResponse:
    """Reply to a send: ``msg_id`` is the broker's offset message id (comma-joined for a batch)."""

    code: ResponseCode  # SUCCESS, or FLUSH_DISK_TIMEOUT / ... (the message *is* stored in those cases)
    msg_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None = None
    remark: str = ""


# -- pull ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PullMessageRequest:
    """PULL_MESSAGE (11). ``sys_flag`` bits: COMMIT_OFFSET 1, SUSPEND 2, SUBSCRIPTION 4, CLASS_FILTER 8."""

    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int = 32
    sys_flag: int = 0
    commit_offset: int = 0
    suspend_timeout_ms: int = 15_000
    subscription: str | None = None  # tag expression ("*", "A || B"); None: use the registered one
    sub_version: int = 0
    expression_type: ExpressionType = ExpressionType.TAG
    #: the broker group of the queue (routing only); "" = the only/any broker
    broker_name: str = ""
    #: which node of the group to read from (routing only; ``PullAPIWrapper.recalculatePullFromWhichNode``:
    #: the last reply's ``suggest_which_broker_id``); 0 = the master
    broker_id: int = 0


class PullMessageResponse:
    """Reply to a pull. ``records`` holds each message's raw commit-log record (exactly the wire body when
    concatenated); ``messages`` decodes them on first access, so a network server that only forwards bytes
    never pays for decoding."""

    def __init__(
        self,
        code: ResponseCode,
        next_begin_offset: int,
        min_offset: int,
        max_offset: int,
        *,
        records: list[bytes] | None = None,
        messages: list[MessageExt] | None = None,
        broker_name: str = "",
        suggest_which_broker_id: int = 0,
        remark: str = "",
    ) -> None:
        self.code = code
        self.next_begin_offset = next_begin_offset
        self.min_offset = min_offset
        self.max_offset = max_offset
        self.records: list[bytes] = records or []
        self._messages = messages
        self.broker_name = broker_name
        self.suggest_which_broker_id = suggest_which_broker_id
        self.remark = remark

    @property
    def messages(self) -> list[MessageExt]:
        if self._messages is None:
            from broker_sim.common.convert import record_to_client

            self._messages = [record_to_client(r, self.broker_name) for r in self.records]
        return self._messages

    @property
    def status(self) -> PullStatus:
        return _PULL_STATUS.get(self.code, PullStatus.OFFSET_ILLEGAL)

    def __repr__(self) -> str:
        return (
            f"PullMessageResponse({self.code.name}, next={self.next_begin_offset}, min={self.min_offset}, "
            f"max={self.max_offset}, {len(self.records) or len(self._messages or [])} msgs)"
        )


# -- clients -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubscriptionData:
    topic: str
    sub_string: str = "*"
    sub_version: int = 0
    expression_type: ExpressionType = ExpressionType.TAG


@dataclass(frozen=True)
class ConsumerData:
    group_name: str
    consume_type: ConsumeType
    message_model: MessageModel
    consume_from_where: ConsumeFromWhere
    subscriptions: tuple[SubscriptionData, ...] = ()
    unit_mode: bool = False


@dataclass(frozen=True)
class HeartbeatData:
    client_id: str
    producer_groups: tuple[str, ...] = ()
    consumers: tuple[ConsumerData, ...] = ()


@dataclass(frozen=True)
class ConsumerSendMsgBackRequest:
    """CONSUMER_SEND_MSG_BACK (36): ``offset`` is the failed message's commit-log offset."""

    group: str
    offset: int
    delay_level: int = 0
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None
    #: the broker group that stored the message (routing only); "" = the only/any broker
    broker_name: str = ""


@dataclass(frozen=True)
class EndTransactionRequest:
    """END_TRANSACTION (37, oneway)."""

    producer_group: str
    msg_id: str  # offset message id of the half message
    transaction_id: str | None
    tran_state_table_offset: int  # half message's queue offset
    commit_log_offset: int
    commit_or_rollback: TransactionType
    from_transaction_check: bool = False
    #: the broker group that stored the half message (routing only); "" = the only/any broker
    broker_name: str = ""


@dataclass(frozen=True)
class QueueProgress:
    """One row of ``consumer progress``: broker offset, consumer offset and the lag between them."""

    queue: MessageQueue
    broker_offset: int
    consumer_offset: int
    last_timestamp: int = 0

    @property
    def lag(self) -> int:
        return max(0, self.broker_offset - self.consumer_offset)


__all__ = [
    "BatchEntry",
    "BrokerData",
    "ConsumeFromWhere",
    "ConsumeType",
    "ConsumerData",
    "ConsumerSendMsgBackRequest",
    "EndTransactionRequest",
    "ExpressionType",
    "HeartbeatData",
    "MessageModel",
    "MessageSelector",
    "Perm",
    "PullMessageRequest",
    "PullMessageResponse",
    "PullStatus",
    "QueueData",
    "QueueProgress",
    "ResponseCode",
    "SendMessageRequest",
    "SendMessageResponse",
    "SubscriptionData",
    "TopicRouteData",
    "TransactionType",
]
