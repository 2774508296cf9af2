"""Pruning settled messages: the stubs, inbox rows and notices of messages every group is done with.

Why: nothing else ever deletes a ``message_stub`` (bodies up to the broker's largest) or a ``message_inbox``
row — the log purge (:mod:`reliable.sweeper.retention`) keeps the journal bounded, not these — so both
tables grew for as long as the service ran. Why not sooner: the inbox row *is* the deduplication — a copy
delivered after its message was pruned finds no row and is applied again. So only messages settled longer
ago than the broker can still deliver a copy qualify: pick ``before`` beyond the broker's retention
(RocketMQ keeps its commit log 72 h by default, Kafka ``retention.ms``, a RabbitMQ queue as long as a
message waits in it) and beyond the sweeper's ``max_unconfirmed_age`` (its resends are copies too).

What qualifies: a stub ``CONFIRMED`` or ``VOIDED`` (every group done) last changed before ``before``, whose
inbox rows are all settled too; and a settled inbox row of a message without a stub (the guard's inbox
pattern: a consumer that is not fed by reliable's producer) last changed before ``before`` — in both cases
with no inbox row of the message changed since (a group the producer did not list claims its own row
later, and that row is its deduplication), and none of its journal rows left: a message is pruned after
the log purge (by age) has taken its deliveries, so a copy delivered lately keeps it, and the report never
sees deliveries of a message it no longer knows. Their notices go with them. In batches, each its own
transaction (``READ COMMITTED`` on MariaDB), inbox rows before stubs (the outbox's lock order). ``before``
must lie ``MIN_PRUNE_AGE_S`` (7 days) back or more.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, Select, and_, delete, exists, or_, select

from reliable import constants as C
from reliable.errors import ConfigurationError
from reliable.models import status_literal, utcnow
from reliable.outbox.tables import OPEN, inbox, log, notif, stub
from reliable.types import StubStatus

_SETTLED = [status_literal(s) for s in (StubStatus.CONFIRMED, StubStatus.VOIDED)]
_OPEN = [status_literal(s) for s in OPEN]


def prunable(engine: Engine, *, before: dt.datetime) -> int:
    """How many messages :func:`prune_settled` would delete now (stubs, plus stub-less settled inbox rows)."""
    _check_cut(before)
    with engine.connect() as conn:
        stubs = len(conn.execute(_settled_stubs(before, None)).all())
        lone = len(conn.execute(_lone_inbox(before, None)).all())
    return stubs + lone


def prune_settled(engine: Engine, *, before: dt.datetime, batch: int = C.DEFAULT_PURGE_BATCH) -> int:
    """Delete settled messages last changed before ``before`` (see the module doc); returns how many.
    ``before`` at least ``MIN_PRUNE_AGE_S`` ago, else :class:`~reliable.errors.ConfigurationError`."""
    _check_cut(before)
    total = 0
    for query in (_settled_stubs, _lone_inbox):
        while True:
            with engine.begin() as conn:
                if conn.dialect.name in ("mysql", "mariadb"):
                    # as the log purge: at REPEATABLE READ the DELETEs' next-key locks held up every new id
                    # staged or claimed near the batch's ids for the batch's length
                    conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                ids = list(conn.execute(query(before, batch)).scalars())
                if not ids:
                    break
                _delete(conn, ids, before)
            total += len(ids)
            if len(ids) < batch:
                break
    return total


def _check_cut(before: dt.datetime) -> None:
    if before.tzinfo is None:
        raise ConfigurationError(
            "the prune cut must be timezone-aware (UTC), e.g. datetime.now(UTC) - 30 days"
        )
    latest = utcnow() - dt.timedelta(seconds=C.MIN_PRUNE_AGE_S)
    if before > latest:
        raise ConfigurationError(
            f"prune cut {before:%Y-%m-%d %H:%M} is less than {C.MIN_PRUNE_AGE_S // 86400} days ago: a copy "
            "the broker still delivers after its message was pruned is applied again"
        )


def _done_before(message_id: Any, before: dt.datetime) -> ColumnElement[bool]:
    """No inbox row of the message is owed (PENDING, DEAD) or changed since ``before`` — a group the producer
    did not list claims a row of its own long after the stub settled, and that row is its deduplication —
    and no journal row of it is left: the log purge has taken them all. A journal row is a delivery; one
    newer than the purge's age proves the broker still delivers copies of the message (an offset reset, a
    log not yet compacted, a requeue). Until 2026-11-28 a message with a copy delivered that very day was
    pruned and the next copy applied again in every group, and the journal rows left behind were counted as
    orphan deliveries by the report."""
    row = inbox.alias("row")
    owed_or_recent = exists().where(
        row.c.message_id == message_id, or_(row.c.status.in_(_OPEN), row.c.updated_at >= before)
    )
    journaled = exists().where(log.c.message_id == message_id)
    return and_(~owed_or_recent, ~journaled)


def _settled_stubs(before: dt.datetime, limit: int | None) -> Select[str]:
    q = (
        select(stub.c.message_id)
        .where(
            stub.c.status.in_(_SETTLED), stub.c.updated_at < before, _done_before(stub.c.message_id, before)
        )
        .order_by(stub.c.message_id)
    )
    return q if limit is None else q.limit(limit)


def _lone_inbox(before: dt.datetime, limit: int | None) -> Select[str]:
    """Messages without a stub whose every inbox row is settled and older than ``before``."""
    has_stub = exists().where(stub.c.message_id == inbox.c.message_id)
    q = (
        select(inbox.c.message_id)
        .where(
            inbox.c.status.in_(_SETTLED),
            inbox.c.updated_at < before,
            ~has_stub,
            _done_before(inbox.c.message_id, before),
        )
        .distinct()
        .order_by(inbox.c.message_id)
    )
    return q if limit is None else q.limit(limit)


def _delete(conn: Connection, ids: Sequence[str], before: dt.datetime) -> None:
    """The messages' notices, inbox rows and stubs — each statement keeps any row that is not settled and
    old (one committed since the batch was read: a late group's claim keeps its row, its deduplication).
    Journal rows are left to the log purge: deleted here they left holes between the offsets of the
    deliveries kept, which the report counted as gaps."""
    conn.execute(delete(notif).where(notif.c.message_id.in_(ids), notif.c.created_at < before))
    conn.execute(
        delete(inbox).where(
            inbox.c.message_id.in_(ids), inbox.c.status.in_(_SETTLED), inbox.c.updated_at < before
        )
    )
    conn.execute(
        delete(stub).where(
            stub.c.message_id.in_(ids), stub.c.status.in_(_SETTLED), stub.c.updated_at < before
        )
    )
