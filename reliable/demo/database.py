"""The demo's dealings with the database beyond the pipeline itself: creating it, clearing an earlier run.

The demo may be pointed at a database that holds other things (``--db``), so everything here is scoped to the
demo's topic and consumer groups: rows an earlier demo run left in the contract tables are deleted, nothing
else is touched.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import Engine, delete, or_, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from reliable.demo.groups import AUDIT_GROUP
from reliable.models import ConsumeProgress, MessageInbox, MessageLog, MessageStub, StubNotification
from reliable.reconcile.config import RETRY_TOPIC_PREFIX

if TYPE_CHECKING:
    from reliable.demo.ledger import Order
    from reliable.producer import StubProducer

log = logging.getLogger("reliable.demo")


def redact(url: str) -> str:
    """``url`` without its password (it is printed in the summary)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1]


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``: what a one-line error or warning shows of a database error."""
    text_ = str(exc).strip()
    return f"{type(exc).__name__}: {text_.splitlines()[0] if text_ else ''}".rstrip(": ")


def ensure_database(url: str) -> None:
    """Create the PostgreSQL database of ``url`` when it does not exist yet (nothing else is created)."""
    if not url.startswith("postgresql"):
        return
    from sqlalchemy import create_engine

    target = make_url(url)
    name = target.database
    if not name:
        return
    admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first()
            if exists is None:
                log.warning("creating database %s", name)
                conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()


def clear_previous_run(session: Session, topic: str, groups: Sequence[str]) -> None:
    """Delete what an earlier demo run left for ``topic``: its stubs with their inbox rows and notices, the
    deliveries of the topic, and the positions on the topic and on the ``%RETRY%`` topics of the groups and
    of any audit group an earlier run had (``--groups 3``)."""
    ids = select(MessageStub.message_id).where(MessageStub.topic == topic)
    retry_topics = [RETRY_TOPIC_PREFIX + g for g in groups]
    session.execute(
        delete(MessageLog).where(or_(MessageLog.topic == topic, MessageLog.original_topic == topic))
    )
    # every demo group's retry topic, not only this run's: a --groups 3 run left demo_audit_2's position,
    # and the next runs' reports listed that group with no rows
    earlier = ConsumeProgress.topic.startswith(RETRY_TOPIC_PREFIX + AUDIT_GROUP, autoescape=True)
    session.execute(
        delete(ConsumeProgress).where(or_(ConsumeProgress.topic.in_([topic, *retry_topics]), earlier))
    )
    session.execute(delete(StubNotification).where(StubNotification.message_id.in_(ids)))
    session.execute(delete(MessageInbox).where(MessageInbox.message_id.in_(ids)))
    session.execute(delete(MessageStub).where(MessageStub.topic == topic))


def staged_ids(engine: Engine, message_ids: Sequence[str]) -> set[str]:
    """Which of ``message_ids`` have a stub (were staged and committed)."""
    with engine.connect() as conn:
        rows = conn.execute(select(MessageStub.message_id).where(MessageStub.message_id.in_(message_ids)))
        return {str(r[0]) for r in rows}


def stage_batch(
    producer: StubProducer, engine: Engine, topic: str, groups: list[str], batch: list[Order], tries: int = 5
) -> None:
    """Stage one batch of orders for every group. A database error (a deadlock with the consumers on
    PostgreSQL, say) is a producer's everyday problem: stage again whatever has no stub yet, as an
    application would; a batch committed but not recorded as sent is the sweeper's to re-send."""
    todo = batch
    for attempt in range(1, tries + 1):
        try:
            with producer.transaction() as tx:
                for order in todo:
                    tx.stage(order.order_id, topic, order.to_body(), groups=groups)
            return
        except SQLAlchemyError as exc:
            log.warning("staging attempt %d failed: %s", attempt, first_line(exc))
            staged = staged_ids(engine, [o.order_id for o in todo])
            todo = [o for o in todo if o.order_id not in staged]
            if not todo:
                return
            if attempt == tries:
                raise
