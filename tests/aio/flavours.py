"""One scenario, two flavours: build the same guarded handler as ``def`` or ``async def`` and drive it alike.

A scenario says *what* the handler does (:class:`Behaviour`) and *what* is delivered; the flavour decides how:
``sync`` calls the guarded handler directly and races with threads, ``async`` awaits it on one event loop
(owned by the flavour for the whole test) and races with tasks. Everything the tests assert is read back
from the database with the sync engine, so both flavours are judged by the same evidence.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from reliable import ConsumeResult, Envelope, Reliability, idempotent_consumer
from reliable.guard import Decision

T = TypeVar("T")

ledger_md = MetaData()
ledger = Table(  # no unique constraint: the guard, not the schema, must keep an effect from repeating
    "aio_test_ledger",
    ledger_md,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(64), nullable=False),
    Column("grp", String(64), nullable=False),
)

_offsets = itertools.count(1)
FLAVOURS = ["sync", "async"]


def env(message_id: str | None, body: bytes = b"{}", *, reconsume_times: int = 0) -> Envelope:
    return Envelope(message_id, "orders", 0, next(_offsets), body, reconsume_times=reconsume_times)


@dataclass
class Behaviour:
    """What the handler does besides its one ledger row: fail for some deliveries, or wait at a gate."""

    fails: Callable[[Envelope], bool] = lambda e: False
    calls: list[str | None] = field(default_factory=list)


class Flavour:
    """Drives guarded handlers of one flavour; ``close()`` releases the loop and the async connections."""

    def __init__(self, name: str, rel: Reliability) -> None:
        self.name = name
        self.rel = rel
        self.loop = asyncio.new_event_loop() if name == "async" else None

    def guard(self, group: str = "g", behaviour: Behaviour | None = None, **options: Any) -> Any:
        b = behaviour or Behaviour()
        if self.loop is None:

            def handler(e: Envelope, session: Session) -> None:
                b.calls.append(e.message_id)
                session.execute(insert(ledger).values(message_id=e.message_id, grp=group))
                if b.fails(e):
                    raise RuntimeError(f"handler failure for {e.message_id}")

            return idempotent_consumer(self.rel, group=group, **options)(handler)

        async def ahandler(e: Envelope, session: AsyncSession) -> None:
            b.calls.append(e.message_id)
            await session.execute(insert(ledger).values(message_id=e.message_id, grp=group))
            await asyncio.sleep(0)  # let other tasks in mid-transaction
            if b.fails(e):
                raise RuntimeError(f"handler failure for {e.message_id}")

        return idempotent_consumer(self.rel, group=group, **options)(ahandler)

    def run(self, value: Any) -> Any:
        """The result of a guarded call: awaited on the flavour's loop when it is a coroutine."""
        if self.loop is None:
            return value
        return self.loop.run_until_complete(value)

    def decide(self, handle: Any, e: Envelope) -> Decision:
        return self.run(handle.decide(e))  # type: ignore[no-any-return]

    def batch(self, handle: Any, envs: Sequence[Envelope]) -> list[Decision]:
        return self.run(handle.decide_batch(envs))  # type: ignore[no-any-return]

    def settled(self, handle: Any, e: Envelope, limit: int = 400) -> list[Decision]:
        """Redeliver (as a broker would, counting reconsume_times) until the guard stops asking for it."""
        return self.race(handle, [e], limit=limit)[0]

    def race(self, handle: Any, envs: Sequence[Envelope], *, limit: int = 400) -> list[list[Decision]]:
        """Deliver each of ``envs`` concurrently (threads or tasks), each redelivered until settled."""
        if self.loop is None:
            barrier = threading.Barrier(len(envs))

            def worker(e: Envelope) -> list[Decision]:
                barrier.wait()
                return _redeliver(lambda x: handle.decide(x), e, limit)

            with ThreadPoolExecutor(len(envs)) as pool:
                return list(pool.map(worker, envs))

        async def task(e: Envelope) -> list[Decision]:
            out: list[Decision] = []
            for n in range(limit):
                d = await handle.decide(replace(e, reconsume_times=e.reconsume_times + n))
                out.append(d)
                if d.result is not ConsumeResult.RECONSUME_LATER:
                    return out
                await asyncio.sleep(0.002)
            raise AssertionError(f"still RECONSUME_LATER after {limit} deliveries")

        async def all_of() -> list[list[Decision]]:
            return list(await asyncio.gather(*(task(e) for e in envs)))

        return self.run(all_of())  # type: ignore[no-any-return]

    def call(self, coro: Callable[[], Coroutine[Any, Any, T]]) -> T:
        assert self.loop is not None
        return self.loop.run_until_complete(coro())

    def close(self) -> None:
        if self.loop is not None:
            # as a service closing its own loop would: aclose sends the queued done markers first
            self.loop.run_until_complete(self.rel.aclose())
            self.loop.close()
        self.rel.close()


def _redeliver(decide: Callable[[Envelope], Decision], e: Envelope, limit: int) -> list[Decision]:
    out: list[Decision] = []
    for n in range(limit):
        d = decide(replace(e, reconsume_times=e.reconsume_times + n))
        out.append(d)
        if d.result is not ConsumeResult.RECONSUME_LATER:
            return out
        time.sleep(0.002)  # the broker's retry delay, not a synchronisation
    raise AssertionError(f"still RECONSUME_LATER after {limit} deliveries")


def make_rel(db_url: str, redis_url: str | None, key_prefix: str, **settings: Any) -> Reliability:
    rel = Reliability(db_url, redis_url, key_prefix=key_prefix, **settings)
    ledger_md.create_all(rel.engine, checkfirst=True)
    with rel.engine.begin() as conn:
        conn.execute(ledger.delete())
    return rel


def applied(rel: Reliability, group: str | None = None) -> dict[str, int]:
    """How often each message's effect was written (per group when given)."""
    q = select(ledger.c.message_id, func.count()).group_by(ledger.c.message_id)
    if group is not None:
        q = q.where(ledger.c.grp == group)
    with rel.engine.connect() as conn:
        return {str(m): int(n) for m, n in conn.execute(q)}


def inbox(rel: Reliability, message_id: str, group: str = "g") -> tuple[str, int] | None:
    """(status, attempts) of the group's inbox row."""
    with rel.engine.connect() as conn:
        row = conn.execute(
            text("SELECT status, attempts FROM message_inbox WHERE consumer_group = :g AND message_id = :m"),
            {"g": group, "m": message_id},
        ).first()
    return None if row is None else (str(row[0]), int(row[1]))


def journal(rel: Reliability, message_id: str) -> list[tuple[str | None, str | None]]:
    """(outcome, reason) of every delivery of ``message_id``, oldest first."""
    with rel.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT outcome, reason FROM message_log WHERE message_id = :m ORDER BY id"),
            {"m": message_id},
        )
        return [(r[0], r[1]) for r in rows]


# --- a worker process killed between its handler and the commit (spawned: must be importable) --------------
def child_killed_before_commit(flavour: str, db_url: str, redis_url: str, key_prefix: str, mid: str) -> None:
    """Run the handler of ``mid`` (its write made), then die before the guard's transaction commits."""
    import os

    from reliable.guard import GuardHooks

    class DieAfterHandler(GuardHooks):
        def after_handler(self, e: Envelope, error: BaseException | None) -> None:
            os._exit(3)

    rel = Reliability(db_url, redis_url, key_prefix=key_prefix, lease_ms=300)
    f = Flavour(flavour, rel)
    f.decide(f.guard(hooks=[DieAfterHandler()]), env(mid))
