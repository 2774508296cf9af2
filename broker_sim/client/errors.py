"""Client-side errors (producers, consumers, transports). Faults are exceptions; expected outcomes are
enums."""

from __future__ import annotations

from broker_sim.errors import BrokerSimError


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
