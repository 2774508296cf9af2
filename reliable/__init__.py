"""reliable: exactly-once effect and no message lost for consumers of at-least-once brokers.

Public API (DESIGN.md §6)::

    from reliable import Reliability, Envelope, ConsumeResult, StubStatus, idempotent_consumer
"""

from __future__ import annotations

from reliable.errors import ReliableError
from reliable.facade import Reliability
from reliable.sender import OutgoingMessage, Sender, SendReceipt
from reliable.types import ConsumeResult, Envelope, LogOutcome, StubStatus

__all__ = [
    "ConsumeResult",
    "Envelope",
    "LogOutcome",
    "OutgoingMessage",
    "Reliability",
    "ReliableError",
    "SendReceipt",
    "Sender",
    "StubStatus",
]
__version__ = "0.1.0"
