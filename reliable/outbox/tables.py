"""The tables the outbox (and the sweeper on top of it) reads and writes, and the states a row is still
owed in: one handle per table, shared."""

from __future__ import annotations

from typing import cast

from sqlalchemy import Table

from reliable.models import MessageInbox, MessageLog, MessageStub, StubNotification
from reliable.types import StubStatus

stub = cast(Table, MessageStub.__table__)
inbox = cast(Table, MessageInbox.__table__)
log = cast(Table, MessageLog.__table__)
notif = cast(Table, StubNotification.__table__)

#: an inbox row some group still owes: due for the sweeper (PENDING) or given up on (DEAD)
OPEN = (StubStatus.PENDING, StubStatus.DEAD)
