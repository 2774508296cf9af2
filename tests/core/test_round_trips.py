"""The round trips and commits each guard path costs, counted (issue 18): they must not creep back up.

Counted with :class:`bench.bench_roundtrips.Counter` — a statement hook on the guard's runner, SQLAlchemy's
statement / begin / commit events and a counting Redis connection — on the calling thread, never timed. The
figures are the ones docs/decorator.md ("Round trips per path, counted") publishes; a change that adds a round
trip to a path makes this test fail and must update both, saying why.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session

from bench.bench_roundtrips import Counter
from reliable import Envelope, Reliability, idempotent_consumer
from reliable.stores.lease import lease_key
from tests.core.guard_helpers import add_stub, apply, env, make_rel

#: path → (database round trips, commits, Redis round trips), per delivery (the batch: per batch of 8)
EXPECTED: dict[str, dict[str, tuple[int, int, int]]] = {
    "postgresql": {
        "new, producer stub": (3, 1, 1),
        "new, no stub (inbox)": (3, 1, 1),
        "duplicate answered by Redis": (0, 0, 1),
        "duplicate answered by the database": (4, 1, 1),
        "handler fails": (6, 1, 2),
        "batch of 8 new, stubs": (12, 1, 1),
    },
    "sqlite": {  # BEGIN IMMEDIATE and COMMIT count as statements (in-process: no network round trip)
        "new, producer stub": (7, 1, 1),
        "new, no stub (inbox)": (6, 1, 1),
        "duplicate answered by Redis": (0, 0, 1),
        "duplicate answered by the database": (7, 1, 1),
        "handler fails": (10, 1, 2),
        "batch of 8 new, stubs": (16, 1, 1),
    },
    "mysql": {  # PyMySQL: no multi-statement messages; SET TRANSACTION (READ COMMITTED) opens each one
        "new, producer stub": (7, 1, 1),
        "new, no stub (inbox)": (9, 1, 1),
        "duplicate answered by Redis": (0, 0, 1),
        "duplicate answered by the database": (7, 1, 1),
        "handler fails": (13, 1, 2),  # the failure count's own SET TRANSACTION (2026-11-28)
        "batch of 8 new, stubs": (17, 1, 1),  # the stubs locked in id order before they settle (2026-11-28)
    },
}


def uid(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def counted(db_url: str, redis_url: str, key_prefix: str) -> Iterator[tuple[Reliability, Counter]]:
    rel = make_rel(db_url, redis_url, key_prefix)
    counter = Counter(rel).attach()
    yield rel, counter
    counter.detach()
    rel.close()


def per_delivery(counter: Counter, run: Callable[[], object], n: int) -> tuple[float, float, float]:
    before = counter.snapshot()
    run()
    after = counter.snapshot()
    return tuple((a - b) / n for a, b in zip(after, before, strict=True))  # type: ignore[return-value]


def test_round_trips_per_path(counted: tuple[Reliability, Counter]) -> None:
    rel, counter = counted
    guard = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(apply)

    def failing(e: Envelope, session: Session) -> None:
        apply(e, session)
        raise RuntimeError("handler failed (round-trip count)")

    broken = idempotent_consumer(rel, group="f", registry=CollectorRegistry())(failing)
    n = 4
    seen: dict[str, tuple[float, float, float]] = {}
    try:
        for _ in range(2):  # warm: statement caches, the compare-and-delete script, the learned mode
            broken(env(uid("warm")))
            add_stub(rel, warm := uid("warm"), "g")
            guard(env(warm))
        stubbed = [uid("s") for _ in range(n)]
        for m in stubbed:
            add_stub(rel, m, "g")
        seen["new, producer stub"] = per_delivery(counter, lambda: [guard(env(m)) for m in stubbed], n)
        for _ in range(3):  # stub-less deliveries teach the guard to claim the inbox row first
            guard(env(uid("teach")))
        bare = [env(uid("i")) for _ in range(n)]
        seen["new, no stub (inbox)"] = per_delivery(counter, lambda: [guard(e) for e in bare], n)
        seen["duplicate answered by Redis"] = per_delivery(counter, lambda: [guard(e) for e in bare], n)
        assert rel.redis is not None
        guard.flush_markers()
        rel.redis.delete(*[lease_key(rel.settings.key_prefix, "g", str(e.message_id)) for e in bare])
        seen["duplicate answered by the database"] = per_delivery(
            counter, lambda: [guard(e) for e in bare], n
        )
        failed = [env(uid("x")) for _ in range(n)]
        seen["handler fails"] = per_delivery(counter, lambda: [broken(e) for e in failed], n)
        batch_ids = [uid("b") for _ in range(8)]
        for m in batch_ids:
            add_stub(rel, m, "g")
        batch = [env(m) for m in batch_ids]
        seen["batch of 8 new, stubs"] = per_delivery(counter, lambda: guard.batch(batch), 1)
    finally:
        guard.close()
        broken.close()
    dialect = "mysql" if rel.dialect in ("mysql", "mariadb") else rel.dialect
    assert seen == {path: tuple(float(v) for v in counts) for path, counts in EXPECTED[dialect].items()}


def test_a_pool_connection_opened_mid_measurement_is_not_a_delivery_round_trip(
    counted: tuple[Reliability, Counter],
) -> None:
    """The done-marker timer thread can hold the pooled Redis connection at the moment a delivery needs one;
    the pool then opens another, whose handshake (CLIENT SETINFO …) is paid once per connection. Counting it
    per delivery made the figures above flaky."""
    rel, counter = counted
    assert rel.redis is not None
    guard = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(apply)
    try:
        guard(env(uid("warm")))
        pool = rel.redis.connection_pool  # type: ignore[union-attr]
        held = pool.get_connection()  # busy elsewhere: the next delivery opens a new one
        try:
            _, _, redis_trips = per_delivery(counter, lambda: guard(env(uid("new"))), 1)
        finally:
            pool.release(held)
    finally:
        guard.close()
    assert redis_trips == 1.0
