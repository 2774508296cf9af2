"""Staging: the PENDING stub and one PENDING inbox row per group, before the first send."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence

from sqlalchemy.orm import Session

from reliable.errors import DuplicateMessageIdError
from reliable.models import MessageInbox, MessageStub
from reliable.types import StubStatus


def payload_hash(body: bytes) -> str:
    """SHA-256 hex of a body: what the guard compares to refuse a different body under the same id."""
    return hashlib.sha256(body).hexdigest()


def stage(
    session: Session,
    message_id: str,
    topic: str,
    body: bytes,
    *,
    groups: Sequence[str],
    tags: str | None,
    now: dt.datetime,
    resend_at: dt.datetime,
    trace_context: str | None = None,
    properties: str | None = None,
) -> str:
    """Add the PENDING stub and one PENDING inbox row per group to ``session``; returns the payload hash."""
    if session.get(MessageStub, message_id) is not None:
        raise DuplicateMessageIdError(f"a stub with message id {message_id!r} already exists")
    digest = payload_hash(body)
    session.add(
        MessageStub(
            message_id=message_id,
            topic=topic,
            tags=tags,
            content=body,
            payload_hash=digest,
            status=StubStatus.PENDING,
            send_count=0,
            resend_at=resend_at,
            created_at=now,
            updated_at=now,
            trace_context=trace_context,
            properties=properties,
        )
    )
    for group in dict.fromkeys(groups):
        session.add(
            MessageInbox(
                consumer_group=group,
                message_id=message_id,
                status=StubStatus.PENDING,
                attempts=0,
                payload_hash=digest,
                resend_count=0,
                resend_at=resend_at,
                created_at=now,
                updated_at=now,
            )
        )
    return digest
