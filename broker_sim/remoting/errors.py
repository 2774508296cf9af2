"""Exceptions of the remoting layer (wire codec, server, TCP client).

Faults only: expected outcomes (a pull that found nothing, an unknown topic) travel as response codes
(:class:`broker_sim.remoting.codes.ResponseCode`), never as exceptions. The TCP client raises the client
package's errors (``TransportError``, ``RequestTimeoutError``) and the broker's typed response errors, as the
transport contract in :mod:`broker_sim.client.transport` requires, so code never cares which transport it has.
"""

from __future__ import annotations

from broker_sim.errors import BrokerSimError


class RemotingError(BrokerSimError):
    """Root of every remoting error."""


class FrameError(RemotingError):
    """A frame cannot be decoded (bad length, truncated, oversized, bad header). The connection that sent it
    is no longer in a known state, so the server closes it."""


class FrameTooLargeError(FrameError):
    """The declared frame length exceeds the configured maximum (16 MiB, as Java's remoting layer)."""


class HeaderFieldError(RemotingError):
    """A request header is well-formed but a field is missing or of the wrong type; answered with
    SYSTEM_ERROR and a remark naming the field, the connection stays open."""


class AclError(RemotingError):
    """A request failed the access-key / signature check."""
