"""Request and response codes of RocketMQ's remoting protocol (numbers as in the reference, §B–§C).

Only codes the simulator understands are listed; any other request code is answered with
REQUEST_CODE_NOT_SUPPORTED, which is what a Java broker does.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

from broker_sim.common.requests import ResponseCode as ResponseCode


class RequestCode(IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    CHECK_CLIENT_CONFIG = 46
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    RESET_CONSUMER_CLIENT_OFFSET = 220
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    GET_TOPICS_BY_CLUSTER = 224
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    GET_CONSUMER_RUNNING_INFO = 307
    CONSUME_MESSAGE_DIRECTLY = 309
    QUERY_CONSUME_QUEUE = 321
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320


# The response codes are the broker's own vocabulary (its errors carry them); one enum serves both layers.


class CommandFlag(IntFlag):
    """Bits of the header's ``flag``: bit 0 marks a response, bit 1 a oneway request (no reply expected)."""

    RESPONSE = 1
    ONEWAY = 2


class PullSysFlag(IntFlag):
    COMMIT_OFFSET = 1
    SUSPEND = 2
    SUBSCRIPTION = 4
    CLASS_FILTER = 8


class LanguageCode(IntEnum):
    """Language byte of the ROCKETMQ binary header (JSON headers carry the name instead)."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11


def code_name(code: int) -> str:
    """A readable name for logs: the enum name when known, else the number."""
    try:
        return RequestCode(code).name
    except ValueError:
        return str(code)
