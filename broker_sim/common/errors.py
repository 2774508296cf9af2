"""Errors raised by broker and client. Broker errors carry the RocketMQ response code that the network
server puts on the wire, so a request handler can ``raise TopicNotExistError(...)``
and the server replies code 17 with the message as remark."""

from __future__ import annotations

from typing import ClassVar

from broker_sim.errors import BrokerSimError


class BrokerError(BrokerSimError):
    """Root of every error raised by :mod:`broker_sim.broker`."""


class BrokerResponseError(BrokerError):
    """A request the broker answers with a non-success response code (``code``) and a remark."""

    default_code: ClassVar[int] = 1  # SYSTEM_ERROR

    def __init__(self, remark: str, code: int | None = None) -> None:
        super().__init__(remark)
        self.code: int = self.default_code if code is None else code
        self.remark = remark


class SystemBusyError(BrokerResponseError):
    default_code = 2


class MessageIllegalError(BrokerResponseError):
    default_code = 13


class ServiceNotAvailableError(BrokerResponseError):
    """Broker not started, shutting down, or (fault injection) crashed."""

    default_code = 14


class NoPermissionError(BrokerResponseError):
    default_code = 16


class TopicNotExistError(BrokerResponseError):
    default_code = 17


class SubscriptionGroupNotExistError(BrokerResponseError):
    default_code = 26


class FlushDiskTimeoutError(BrokerResponseError):
    default_code = 10


class BrokerConfigError(BrokerError):
    """Bad broker configuration (unknown option, out-of-range value)."""


class InvalidTopicError(BrokerResponseError, BrokerConfigError):
    """An admin request for a topic with a bad name or queue count (answered SYSTEM_ERROR on the wire)."""

    default_code = 1


_BY_CODE: dict[int, type[BrokerResponseError]] = {
    c.default_code: c
    for c in (
        SystemBusyError,
        MessageIllegalError,
        ServiceNotAvailableError,
        NoPermissionError,
        TopicNotExistError,
        SubscriptionGroupNotExistError,
        FlushDiskTimeoutError,
    )
}


def error_for_code(code: int, remark: str) -> BrokerResponseError:
    """The typed error for a reply code (used by the TCP client to raise what the in-process broker
    raises)."""
    return _BY_CODE.get(code, BrokerResponseError)(remark, code)


# -- client side ------------------------------------------------------------------------------------------


class ClientError(BrokerSimError):
    """Root of every error raised by :mod:`broker_sim.client`."""


class ClientStateError(ClientError):
    """An operation was called in the wrong life-cycle state (send before start, subscribe after start)."""


class InvalidMessageError(ClientError):
    """A message the client refuses to send (empty body, bad topic name, body over the size limit)."""


class TransportError(ClientError):
    """The transport could not complete a request (connection refused/closed, undecodable reply)."""


class RequestTimeoutError(TransportError):
    """No reply in time. For a send this is ambiguous: the broker may have stored the message (lost ACK)."""


class SendFailedError(ClientError):
    """Every attempt of a send failed; ``__cause__`` holds the last error."""


class MQClientError(ClientError):
    """A consumer-side request failed in a way the caller must see (e.g. pull on an unknown queue)."""
