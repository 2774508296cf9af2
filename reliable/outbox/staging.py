"""Staging: the PENDING stub and one PENDING inbox row per group, before the first send."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import Engine, Select, select
from sqlalchemy.orm import Session

from reliable.errors import DuplicateMessageIdError
from reliable.models import MessageInbox, MessageStub
from reliable.types import StubStatus

if TYPE_CHECKING:  # the asyncio extension needs greenlet, which a sync-only install may not have
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession


def payload_hash(body: bytes) -> str:
    """SHA-256 hex of a body: what the guard compares to refuse a different body under the same id."""
    return hashlib.sha256(body).hexdigest()


#: ``session.info`` key: the ids staged in that session
STAGED_IDS = "reliable.staged_ids"


def staged_elsewhere(engine: Engine, session: Session) -> list[str]:
    """After ``session``'s commit failed on a unique key: the ids it staged that a stub now exists for —
    staged and committed by another transaction meanwhile (asked on a connection of its own)."""
    ids = sorted(session.info.get(STAGED_IDS, ()))
    if not ids:
        return []
    with engine.connect() as conn:
        return list(conn.scalars(_existing(ids)))


async def staged_elsewhere_async(engine: AsyncEngine, session: AsyncSession) -> list[str]:
    """:func:`staged_elsewhere` for an ``AsyncSession``, asked through the async engine."""
    ids = sorted(session.sync_session.info.get(STAGED_IDS, ()))
    if not ids:
        return []
    async with engine.connect() as conn:
        return list(await conn.scalars(_existing(ids)))


def _existing(ids: Sequence[str]) -> Select[str]:
    return select(MessageStub.message_id).where(MessageStub.message_id.in_(ids))


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
    """Add the PENDING stub and one PENDING inbox row per group to ``session``; returns the payload hash.

    The id goes into ``session.info`` (:data:`STAGED_IDS`) too: if another transaction stages the same id
    at the same moment, both pass the lookup below and the database's unique key refuses the second commit —
    :func:`staged_elsewhere` then tells that apart from any other constraint of the caller's."""
    if any(isinstance(o, MessageStub) and o.message_id == message_id for o in session.new):
        # staged in this transaction and not flushed yet (autoflush off): the lookup below does not see it
        raise DuplicateMessageIdError(f"message id {message_id!r} is staged twice in one transaction")
    if session.get(MessageStub, message_id) is not None:
        raise DuplicateMessageIdError(f"a stub with message id {message_id!r} already exists")
    session.info.setdefault(STAGED_IDS, set()).add(message_id)
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
