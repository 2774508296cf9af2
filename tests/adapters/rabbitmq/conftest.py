"""Fixtures and helpers of the RabbitMQ adapter tests: a clean PostgreSQL schema with an effects table, a
uniquely named topology per test (deleted at the end), a plain channel to publish raw messages and look into
queues."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from pika.spec import BasicProperties
from sqlalchemy import Column, Integer, MetaData, String, Table, delete, func, select
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.adapters.rabbitmq import (
    Topology,
)
from tests.conftest import _ensure_clean_schema

GROUP = "rmq-g"
TOPIC = "orders"
TIMEOUT_S = 20.0

effects_md = MetaData()
effects = Table(
    "rabbitmq_test_effect",
    effects_md,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(64), nullable=False),
)


# --- fixtures ---------------------------------------------------------------------------------------------


@pytest.fixture
def rel(postgres_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    _ensure_clean_schema(postgres_url)
    # journal every delivery in-line: these tests read DUPLICATE rows right after the consumer returns (the
    # default write-behind journal writes them within journal_flush_ms; tests/core/test_write_behind.py)
    r = Reliability(
        postgres_url,
        redis_url,
        key_prefix=key_prefix,
        max_attempts=3,
        lease_ms=5000,
        journal_write_behind=False,
    )
    effects_md.create_all(r.engine)
    with r.engine.begin() as conn:
        conn.execute(delete(effects))
    yield r
    r.close()


@pytest.fixture
def topology(rabbitmq_url: str) -> Iterator[Topology]:
    name = f"rt-{uuid.uuid4().hex[:12]}"
    topo = Topology(queue=name, exchange=f"{name}.x", binding_key=TOPIC)
    yield topo
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        topo.delete(conn.channel())
    finally:
        conn.close()


@pytest.fixture
def admin(rabbitmq_url: str) -> Iterator[Any]:
    """A plain channel for publishing raw messages and inspecting queues."""
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    yield conn.channel()
    conn.close()


def make_handler(rel: Reliability, fail_first: set[str] | None = None, always_fail: bool = False) -> Any:
    failed: set[str] = set()

    @idempotent_consumer(rel, group=GROUP)
    def handle(env: Envelope, session: Session) -> None:
        assert env.message_id is not None
        session.execute(effects.insert().values(message_id=env.message_id))
        if always_fail or (fail_first and env.message_id in fail_first and env.message_id not in failed):
            failed.add(env.message_id)
            raise RuntimeError(f"transient failure for {env.message_id}")

    return handle


def effect_counts(rel: Reliability) -> dict[str, int]:
    with rel.session() as s:
        rows = s.execute(select(effects.c.message_id, func.count()).group_by(effects.c.message_id)).all()
    return {mid: n for mid, n in rows}


def dlq_messages(admin: Any, topo: Topology) -> list[tuple[BasicProperties, bytes]]:
    out: list[tuple[BasicProperties, bytes]] = []
    while True:
        method, props, body = admin.basic_get(topo.dead_letter_queue, auto_ack=True)
        if method is None:
            return out
        out.append((props, body))


def queue_depth(admin: Any, queue: str) -> int:
    return int(admin.queue_declare(queue, passive=True).method.message_count)
