"""Faults of the storage engine. Expected outcomes of a put or a get are *statuses* (see
:mod:`broker_sim.store.message_store`); these exceptions are for things that should not happen in normal
operation: a malformed message handed to a validator, a corrupt store that recovery refuses to cut, a
config file that cannot be read, a store used before ``start()``."""

from __future__ import annotations

from broker_sim.errors import BrokerSimError


class StoreError(BrokerSimError):
    """Root of every error raised by :mod:`broker_sim.store`."""


class MessageIllegalError(StoreError):
    """A message breaks RocketMQ's rules (topic name/length, body size, field ranges)."""


class PropertiesSizeExceededError(MessageIllegalError):
    """The encoded properties do not fit the signed 16-bit PROPERTIESLEN field (32767 bytes)."""


class StoreNotRunningError(StoreError):
    """The store was used before ``start()`` or after ``shutdown()``/``crash()``."""


class CorruptRecordError(StoreError):
    """A commit-log record failed its magic/size/CRC check *and* valid records follow it.

    A torn tail is normal after a crash and is cut silently (and reported); a corrupt record in the middle
    means acknowledged data would be thrown away, so recovery stops and says where, unless the store is
    configured with ``truncate_corrupt_middle=True``.
    """

    def __init__(self, offset: int, reason: str, valid_bytes_after: int) -> None:
        super().__init__(
            f"corrupt commit-log record at physical offset {offset} ({reason}); "
            f"valid records follow it (at least {valid_bytes_after} bytes)"
        )
        self.offset = offset
        self.reason = reason
        self.valid_bytes_after = valid_bytes_after


class ConfigFileError(StoreError):
    """A config file and its ``.bak`` are both unreadable (or hold the wrong shape)."""


class StoreLayoutError(StoreError):
    """The store directory holds files that do not fit the layout (bad names, wrong sizes, gaps)."""
