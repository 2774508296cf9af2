"""Every exception `reliable` raises on purpose derives from :class:`ReliableError`.

Expected outcomes (a duplicate, a lease held by another worker) are *not* exceptions: they are
:class:`reliable.types.ConsumeResult` / :class:`reliable.types.Outcome` values. Exceptions are for faults
and bad input, so a caller can ``except ReliableError`` without also swallowing its own bugs.
"""

from __future__ import annotations


class ReliableError(Exception):
    """Root of every error raised by :mod:`reliable`."""


class ConfigurationError(ReliableError):
    """A setting is missing, malformed or contradicts another one."""


class BadMessageError(ReliableError):
    """A delivery cannot be processed as it is; it belongs in the dead-letter path, with this reason."""


class MissingMessageIdError(BadMessageError):
    """No business message id could be extracted from a delivery (no id, no keys, no UNIQ_KEY)."""


class PayloadMismatchError(BadMessageError):
    """The same message id arrived with a different body than the one recorded first."""


class SendError(ReliableError):
    """The broker did not accept a message; the stub stays PENDING for the resend sweeper."""


class StoreUnavailableError(ReliableError):
    """The database (the source of truth) could not be reached; the delivery must be retried later."""


class StubNotFoundError(ReliableError):
    """An operation named a message stub that does not exist."""


class InvalidStubStateError(ReliableError):
    """An operation is not allowed in the stub's current status (e.g. reviving a CONFIRMED stub)."""


class InvalidMessageError(ReliableError):
    """A producer was asked to stage a message it must not (empty/oversized id, malformed topic or group)."""


class DuplicateMessageIdError(ReliableError):
    """A stub with this id already exists: ids are business-unique, a second intent is a caller bug."""


class MigrationRefusedError(ReliableError):
    """A migration step would fail half-way on the rows the database holds (MariaDB/MySQL DDL commits as it
    goes, leaving a mixed schema), or cannot run in offline ``--sql`` mode: refused before any change."""
