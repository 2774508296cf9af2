"""reliable: exactly-once effect and no message lost for consumers of at-least-once brokers.

Public API (DESIGN.md §6)::

    from reliable import Reliability, Envelope, ConsumeResult, StubStatus, idempotent_consumer
"""

from __future__ import annotations

from reliable.decorator import GuardedHandler, idempotent_consumer
from reliable.errors import ReliableError
from reliable.facade import Reliability
from reliable.guard.decision import Decision, GuardHooks, Reason
from reliable.producer import StagedMessage, StubProducer
from reliable.sender import OutgoingMessage, Sender, SendReceipt
from reliable.types import ConsumeResult, Envelope, InboxStatus, LogOutcome, StubStatus

__all__ = [
    "ConsumeResult",
    "Decision",
    "Envelope",
    "GuardHooks",
    "GuardedHandler",
    "InboxStatus",
    "LogOutcome",
    "OutgoingMessage",
    "Reason",
    "Reliability",
    "ReliableError",
    "SendReceipt",
    "Sender",
    "StagedMessage",
    "StubProducer",
    "StubStatus",
    "idempotent_consumer",
]
__version__ = "0.1.0"
