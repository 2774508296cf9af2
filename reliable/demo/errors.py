"""Errors of the demo orchestration (all derive from :class:`reliable.errors.ReliableError`)."""

from __future__ import annotations

from reliable.errors import ReliableError


class DemoError(ReliableError):
    """Root of every error the demo raises on purpose."""


class PartMissingError(DemoError):
    """A part the demo glues together (broker server, guard, sweeper, reconciliation) is not available."""


class ServiceStartError(DemoError):
    """A process the demo starts (broker-sim serve, redis-server, a consumer) did not come up in time."""


class DemoTimeoutError(DemoError):
    """The pipeline did not settle (every stub CONFIRMED or DEAD) within the allowed time."""


class BadOrderError(DemoError):
    """A message body is not a well-formed demo order; the guard dead-letters it with this reason."""
