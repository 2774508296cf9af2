"""The two tables the outbox writes, and the states a row is still owed in."""

from __future__ import annotations

from typing import cast

from sqlalchemy import Table

from reliable.models import MessageInbox, MessageStub
from reliable.types import StubStatus

stub = cast(Table, MessageStub.__table__)
inbox = cast(Table, MessageInbox.__table__)

#: an inbox row some group still owes: due for the sweeper (PENDING) or given up on (DEAD)
OPEN = (StubStatus.PENDING, StubStatus.DEAD)
