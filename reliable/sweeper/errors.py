"""Faults of the resend sweeper.

Expected outcomes of a round (a stub re-sent, skipped because a worker holds its lease, given up) are counted
in :class:`reliable.sweeper.summary.RoundSummary`, not raised. Exceptions are for bad configuration and for
faults a caller must see (a channel that cannot deliver, a sender factory that cannot be loaded).
"""

from __future__ import annotations

from reliable.errors import ReliableError


class SweeperError(ReliableError):
    """Root of every error raised by :mod:`reliable.sweeper`."""


class SweeperConfigError(SweeperError):
    """A sweeper option (backoff spec, duration, cron expression, channel settings) cannot be used."""


class NotifyError(SweeperError):
    """A notification channel could not deliver; the notice stays pending and is retried next round."""


class SenderLoadError(SweeperError):
    """``--sender MODULE:FACTORY`` could not be imported or did not return a Sender."""
