"""The demo's second kind of consumer group: an audit trail, one row per order per audit group.

It exists to prove the per-group promise: the audit groups consume the *same* messages as the ledger group
(RocketMQ fan-out: one topic, several consumer groups, each processing every message) and each must apply
every order exactly once through its own guarded handler. Like the ledger, ``demo_audit`` has **no** unique
constraint on ``(consumer_group, order_id)``: a double application must show up as two rows, not be
prevented by the schema, or the demo would prove nothing about the guard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sqlalchemy import BigInteger, Column, Engine, MetaData, String, Table, func, insert, select
from sqlalchemy.orm import Session

from reliable.demo.ledger import ExactlyOnce, Order, exactly_once
from reliable.models import BigId, UTCDateTime, utcnow
from reliable.types import Envelope

audit_metadata = MetaData()

audit = Table(
    "demo_audit",
    audit_metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("consumer_group", String(255), nullable=False),
    Column("order_id", String(64), nullable=False, index=True),
    Column("amount", BigInteger, nullable=False),
    Column("worker", String(64)),
    Column("applied_at", UTCDateTime, nullable=False),
)


def reset(engine: Engine) -> None:
    """(Re)create the audit table, empty. Touches no other table."""
    audit_metadata.drop_all(engine)
    audit_metadata.create_all(engine)


def make_business_handler(group: str, worker: str) -> Callable[[Envelope, Session], None]:
    """The undecorated audit handler of ``group``: one audit row per order, inside the guard's transaction."""

    def record(env: Envelope, session: Session) -> None:
        order = Order.from_body(env.body)
        session.execute(
            insert(audit).values(
                consumer_group=group,
                order_id=order.order_id,
                amount=order.amount,
                worker=worker,
                applied_at=utcnow(),
            )
        )

    record.__name__ = "audit"
    return record


def check(engine: Engine, group: str, order_ids: Iterable[str]) -> ExactlyOnce:
    """Count the audit rows of ``group`` per order against the orders that were produced."""
    with engine.connect() as conn:
        counts = {
            str(oid): int(n)
            for oid, n in conn.execute(
                select(audit.c.order_id, func.count())
                .where(audit.c.consumer_group == group)
                .group_by(audit.c.order_id)
            )
        }
    return exactly_once(counts, order_ids)
