"""A production topology for ``async def`` handlers behind RocketMQ 4.x push consumers, for the tests of
``test_rocketmq4_aio.py``: ``broker-sim serve`` (remoting) on free loopback ports, one topic of 4 queues, the
groups ``billing`` (two consumer instances), ``audit`` (one) and ``archive`` (expected, never consuming), a
stub-first producer with inbox rows for all three, and evidence read back with the sync engine."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from reliable import Reliability, idempotent_consumer
from reliable.adapters.broker_sim import BrokerSimSender, GuardedListener, send_back_to_dlq
from reliable.demo.services import BrokerServer
from reliable.models import ConsumeProgress, MessageInbox, MessageLog
from reliable.producer import StubProducer
from reliable.types import Envelope, StubStatus

TOPIC = "AioOrders"
GROUPS = ("billing", "audit", "archive")
#: free loopback ports by default (``BrokerServer``'s own); ``AIO4_PORT_BASE=N`` pins each test's pair to
#: ``N + 2 × slot`` instead (a machine whose tools need known ports)
PORT_BASE = int(os.environ["AIO4_PORT_BASE"]) if os.environ.get("AIO4_PORT_BASE") else None

effects_md = MetaData()
effects = Table(  # no unique constraint: the guard, not the schema, must keep an effect from repeating
    "aio4_effects",
    effects_md,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(64), nullable=False),
    Column("grp", String(64), nullable=False),
)


def broker_server(tmp_path: Path, slot: int, **extra: str) -> BrokerServer:
    """``broker-sim serve`` with ``TOPIC`` on 4 queues and retries due after 1 s, on free ports
    (or, pinned, on two ports of slot ``slot``: each test takes a slot of its own)."""
    config = {"topics": json.dumps({TOPIC: 4}), "message_delay_level": "1s 1s 1s 1s 1s", **extra}
    args = ["--log-level", "WARNING"]
    for key, value in config.items():
        args += ["--set", f"{key}={value}"]
    if PORT_BASE is None:
        return BrokerServer(tmp_path / "store", tmp_path / "logs", args)
    port = PORT_BASE + 2 * slot
    return BrokerServer(tmp_path / "store", tmp_path / "logs", args, namesrv_port=port, broker_port=port + 1)


def make_rel(db_url: str, redis_url: str | None, key_prefix: str, **settings: Any) -> Reliability:
    rel = Reliability(db_url, redis_url, key_prefix=key_prefix, lease_ms=3000, **settings)
    effects_md.create_all(rel.engine, checkfirst=True)
    with rel.engine.begin() as conn:
        conn.execute(effects.delete())
    return rel


def stage(rel: Reliability, address: str, ids: list[str]) -> None:
    """Stub-first: one inbox row per group (all three) and the send after the commit."""
    from broker_sim.client.producer import Producer

    producer = Producer(address, "aio4_p")
    try:
        stubs = StubProducer(rel, BrokerSimSender(producer))
        with stubs.transaction() as tx:
            for mid in ids:
                tx.stage(mid, TOPIC, json.dumps({"id": mid}).encode(), groups=list(GROUPS))
        assert all(r.receipt is not None for r in tx.results), "every stub sent"
    finally:
        producer.shutdown()


Before = Callable[[Envelope], Awaitable[None]]


def async_handler(
    rel: Reliability, group: str, before: Before | None = None, after: Before | None = None, **options: Any
) -> Any:
    """The team's ``async def`` handler: one effect row per message in the guard's ``AsyncSession``
    (``before``/``after`` the write, inside the guard's transaction)."""

    async def handle(env: Envelope, session: AsyncSession) -> None:
        if before is not None:
            await before(env)
        await session.execute(insert(effects).values(message_id=env.message_id, grp=group))
        if after is not None:
            await after(env)

    return idempotent_consumer(rel, group=group, **options)(handle)


@dataclass
class Instance:
    """One consumer process's worth: a broker_sim ``PushConsumer`` (CLUSTERING, offsets on the broker)."""

    consumer: Any
    listener: GuardedListener

    def stop(self) -> None:
        self.consumer.shutdown()
        self.listener.close()


@dataclass
class Instances:
    started: list[Instance] = field(default_factory=list)

    def start(self, address: str, handler: Any, *, max_reconsume_times: int = 16, **kw: Any) -> Instance:
        from broker_sim.client.push_consumer import PushConsumer
        from broker_sim.common.requests import ConsumeFromWhere

        consumer = PushConsumer(
            address,
            handler.group,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            max_reconsume_times=max_reconsume_times,
            rebalance_interval_ms=1000,
            **kw,
        )
        listener = GuardedListener(
            handler,
            send_back_to_dlq(consumer.transport, handler.group),
            max_reconsume_times=max_reconsume_times,
        )
        consumer.subscribe(TOPIC, "*", listener)
        consumer.start()
        instance = Instance(consumer, listener)
        self.started.append(instance)
        return instance

    def stop_all(self) -> None:
        for instance in self.started:
            instance.stop()
        self.started.clear()


def effect_counts(rel: Reliability, group: str) -> dict[str, int]:
    q = (
        select(effects.c.message_id, func.count())
        .where(effects.c.grp == group)
        .group_by(effects.c.message_id)
    )
    with rel.engine.connect() as conn:
        return {str(m): int(n) for m, n in conn.execute(q)}


def statuses(rel: Reliability, group: str) -> dict[str, StubStatus]:
    with Session(rel.engine) as s:
        rows = s.scalars(select(MessageInbox).where(MessageInbox.consumer_group == group))
        return {r.message_id: StubStatus(r.status) for r in rows}


def inbox_row(rel: Reliability, group: str, message_id: str) -> MessageInbox:
    with Session(rel.engine) as s:
        return s.scalars(
            select(MessageInbox).where(
                MessageInbox.consumer_group == group, MessageInbox.message_id == message_id
            )
        ).one()


def watermarks(rel: Reliability, group: str) -> dict[tuple[str, int], int]:
    with Session(rel.engine) as s:
        rows = s.scalars(select(ConsumeProgress).where(ConsumeProgress.consumer_group == group))
        return {(p.topic, p.queue_id): p.max_offset for p in rows}


def deliveries(rel: Reliability, group: str, message_id: str) -> list[tuple[str, int, str | None]]:
    """(delivered topic, reconsume_times, outcome) of each journaled delivery, oldest first."""
    with Session(rel.engine) as s:
        rows = s.scalars(
            select(MessageLog)
            .where(MessageLog.consumer_group == group, MessageLog.message_id == message_id)
            .order_by(MessageLog.id)
        )
        return [(r.topic, r.reconsume_times, None if r.outcome is None else str(r.outcome)) for r in rows]


def kill_sessions(rel: Reliability) -> int:
    """End every other session of the test's own database (``pg_terminate_backend`` / ``KILL``), as a DBA or a
    failover does; the shared server itself keeps running. Returns how many were ended."""
    from sqlalchemy import text

    with rel.engine.connect() as admin:
        if rel.engine.dialect.name == "postgresql":
            return int(
                admin.execute(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).scalar_one()
            )
        me = admin.execute(text("SELECT CONNECTION_ID()")).scalar_one()
        ids = admin.execute(
            text("SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> :me"),
            {"me": me},
        ).scalars()
        ended = 0
        for pid in list(ids):
            try:
                admin.execute(text(f"KILL {int(pid)}"))
                ended += 1
            except Exception as exc:  # the session ended on its own meanwhile
                if "Unknown thread id" not in str(exc):
                    raise
        return ended
