"""Shared pieces of the guard tests: a ledger table written through ``session``, envelopes, counters.

The ledger has no unique constraint on purpose: the guard, not the schema, must keep a message from being
applied twice, so a duplicate shows up as a second row and the invariant check can see it.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select, text
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.types import StubStatus

ledger_md = MetaData()
ledger = Table(
    "guard_test_ledger",
    ledger_md,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(64), nullable=False),
    Column("note", String(64)),
)

_offsets = itertools.count(1)

#: SQLAlchemy's connection events: a listener for any of them on an engine makes SQLAlchemy dispatch events at
#: every begin, statement and commit of every connection of that engine, the handler's statements included
CONNECTION_EVENTS = (
    "engine_connect",
    "begin",
    "commit",
    "rollback",
    "before_execute",
    "after_execute",
    "before_cursor_execute",
    "after_cursor_execute",
    "savepoint",
    "rollback_savepoint",
    "release_savepoint",
)


def make_rel(db_url: str, redis_url: str | None, key_prefix: str, **settings: Any) -> Reliability:
    rel = Reliability(db_url, redis_url, key_prefix=key_prefix, **settings)
    ledger_md.create_all(rel.engine, checkfirst=True)
    with rel.engine.begin() as conn:
        conn.execute(ledger.delete())
    return rel


def env(
    message_id: str | None, body: bytes = b"{}", *, reconsume_times: int = 0, queue_id: int = 0
) -> Envelope:
    return Envelope(
        message_id=message_id,
        topic="orders",
        queue_id=queue_id,
        queue_offset=next(_offsets),
        body=body,
        reconsume_times=reconsume_times,
    )


def apply(env_: Envelope, session: Session, note: str = "x") -> None:
    """The business effect: one ledger row per application."""
    session.execute(insert(ledger).values(message_id=env_.message_id, note=note))


def applied(rel: Reliability, message_id: str | None = None) -> int:
    with rel.engine.connect() as conn:
        q = select(func.count()).select_from(ledger)
        if message_id is not None:
            q = q.where(ledger.c.message_id == message_id)
        return int(conn.execute(q).scalar_one())


def per_message(rel: Reliability) -> dict[str, int]:
    with rel.engine.connect() as conn:
        rows = conn.execute(select(ledger.c.message_id, func.count()).group_by(ledger.c.message_id)).all()
    return {str(r[0]): int(r[1]) for r in rows}


def log_rows(rel: Reliability, message_id: str | None = None) -> list[tuple[str, str | None, str | None]]:
    """(message_id, outcome, reason) of the journal, oldest first."""
    sql = "SELECT message_id, outcome, reason FROM message_log"
    params: dict[str, object] = {}
    if message_id is not None:
        sql += " WHERE message_id = :m"
        params["m"] = message_id
    with rel.engine.connect() as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(text(sql + " ORDER BY id"), params)]


def stub_status(rel: Reliability, message_id: str) -> StubStatus | None:
    v = _stub_column(rel, "status", message_id)
    return None if v is None else StubStatus(str(v))


def stub_error(rel: Reliability, message_id: str) -> str | None:
    v = _stub_column(rel, "last_error", message_id)
    return None if v is None else str(v)


def failed_send(rel: Reliability, message_id: str) -> None:
    """The producer's send of ``message_id`` failed: its stub shows why until the message is applied."""
    with rel.engine.begin() as conn:
        conn.execute(
            text("UPDATE message_stub SET last_error = 'ConnectionError: broker down' WHERE message_id = :m"),
            {"m": message_id},
        )


def _stub_column(rel: Reliability, column: str, message_id: str) -> object:
    with rel.engine.connect() as conn:
        return conn.execute(
            text(f"SELECT {column} FROM message_stub WHERE message_id = :m"), {"m": message_id}
        ).scalar()


def inbox_status(rel: Reliability, group: str, message_id: str) -> StubStatus | None:
    """The status of ``group``'s inbox row of ``message_id`` (``None``: the group has none)."""
    v = _inbox_column(rel, "status", group, message_id)
    return None if v is None else StubStatus(str(v))


def inbox_attempts(rel: Reliability, group: str, message_id: str) -> int | None:
    v = _inbox_column(rel, "attempts", group, message_id)
    return None if v is None else int(str(v))


def inbox_error(rel: Reliability, group: str, message_id: str) -> str | None:
    v = _inbox_column(rel, "last_error", group, message_id)
    return None if v is None else str(v)


def _inbox_column(rel: Reliability, column: str, group: str, message_id: str) -> object:
    with rel.engine.connect() as conn:
        return conn.execute(
            text(f"SELECT {column} FROM message_inbox WHERE consumer_group = :g AND message_id = :m"),
            {"g": group, "m": message_id},
        ).scalar()


def add_stub(
    rel: Reliability,
    message_id: str,
    group: str | Sequence[str],
    *,
    body: bytes = b"{}",
    status: StubStatus = StubStatus.PENDING,
    payload_hash: str | None = None,
) -> None:
    """A producer-side stub plus a PENDING inbox row per group, as the stub-first producer stages them.

    ``status`` other than PENDING is written on the stub and on every inbox row.
    """
    import hashlib

    from reliable import outbox
    from reliable.models import MessageInbox, MessageStub, utcnow

    groups = [group] if isinstance(group, str) else list(group)
    now = utcnow()
    with rel.session() as s:
        outbox.stage(s, message_id, "orders", body, groups=groups, tags=None, now=now, resend_at=now)
        s.flush()
        stub = s.get(MessageStub, message_id)
        assert stub is not None
        stub.send_count = 1
        stub.status = status
        for g in groups:
            row = s.get(MessageInbox, (g, message_id))
            assert row is not None
            row.status = status
            if payload_hash is not None:
                row.payload_hash = stub.payload_hash = payload_hash or hashlib.sha256(body).hexdigest()


def settled(handler: Callable[[Envelope], object], e: Envelope, timeout: float = 30.0) -> list[object]:
    """Redeliver ``e`` (as a broker would, counting reconsume_times) until the guard stops asking for it.

    The short pause between redeliveries stands in for the broker's retry delay; the loop ends on the
    guard's answer, or fails at the deadline.
    """
    from dataclasses import replace

    from reliable import ConsumeResult

    results: list[object] = []
    deadline = time.monotonic() + timeout
    n = 0
    while True:
        r = handler(replace(e, reconsume_times=e.reconsume_times + n))
        results.append(r)
        if r != ConsumeResult.RECONSUME_LATER:
            return results
        if time.monotonic() > deadline:
            raise AssertionError(f"still RECONSUME_LATER after {len(results)} deliveries")
        n += 1
        time.sleep(0.005)


# --- child processes (spawn: everything they run must be importable) -----------------------------------
def child_consume(
    db_url: str, redis_url: str | None, key_prefix: str, ids: list[str], barrier: object
) -> None:
    """A worker process: deliver every id until settled (each process starts at a different id)."""
    from reliable import idempotent_consumer

    rel = Reliability(db_url, redis_url, key_prefix=key_prefix)
    handle = idempotent_consumer(rel, group="g")(apply)
    barrier.wait()  # type: ignore[attr-defined]
    for m in ids:
        settled(handle, env(m))
    rel.close()


def child_die_in_handler(
    db_url: str, redis_url: str, key_prefix: str, message_id: str, lease_ms: int, offset: int | None = None
) -> None:
    """Take the lease, write the effect through ``session``, then die before the commit."""
    import os

    from reliable import idempotent_consumer

    rel = Reliability(db_url, redis_url, key_prefix=key_prefix, lease_ms=lease_ms)

    def handler(e: Envelope, session: Session) -> None:
        apply(e, session)
        session.flush()
        os._exit(3)

    delivery = env(message_id)
    if offset is not None:
        delivery = Envelope(message_id, delivery.topic, delivery.queue_id, offset, delivery.body)
    idempotent_consumer(rel, group="g")(handler)(delivery)


def child_fan_out(
    db_url: str, redis_url: str | None, key_prefix: str, ids: list[str], groups: list[str], barrier: object
) -> None:
    """A worker process consuming every id for every group (as one process hosting three consumers)."""
    from reliable import idempotent_consumer

    rel = Reliability(db_url, redis_url, key_prefix=key_prefix)
    handlers = [idempotent_consumer(rel, group=g)(ledger_writer(g)) for g in groups]
    barrier.wait()  # type: ignore[attr-defined]
    for m in ids:
        for handle in handlers:
            settled(handle, env(m))
    rel.close()


def ledger_writer(group: str) -> Callable[[Envelope, Session], None]:
    """A handler whose effect is one ledger row noted with its group."""

    def handle(e: Envelope, session: Session) -> None:
        apply(e, session, note=group)

    return handle


def per_group(rel: Reliability) -> dict[tuple[str, str], int]:
    """(group, message id) → ledger rows."""
    with rel.engine.connect() as conn:
        rows = conn.execute(
            select(ledger.c.note, ledger.c.message_id, func.count()).group_by(
                ledger.c.note, ledger.c.message_id
            )
        ).all()
    return {(str(r[0]), str(r[1])): int(r[2]) for r in rows}


def uid(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def counting(rel: Reliability, registry: CollectorRegistry, **kw: object):  # type: ignore[no-untyped-def]
    calls: list[str] = []

    @idempotent_consumer(rel, group="g", registry=registry, **kw)  # type: ignore[arg-type]
    def handle(e: Envelope, session: Session) -> None:
        calls.append(str(e.message_id))
        apply(e, session)

    return handle, calls
