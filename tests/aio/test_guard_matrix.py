"""The guard's scenario matrix, run for ``def`` and ``async def`` handlers on SQLite, PostgreSQL and MariaDB.

Each test states a promise of DESIGN.md §2 once and is parametrised over the flavour (``sync`` / ``async``)
and the backend (``db_url``): duplicates in every order and with concurrency, a handler that fails and then
succeeds, Redis flushed and down, a different body under a known id, a delivery without an id, and fan-out
to three groups. Both flavours run the same guard; these tests prove the asyncio edges keep every promise.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reliable import ConsumeResult, Reliability
from reliable.guard import Reason
from reliable.models import utcnow
from reliable.stores.lease import lease_key
from reliable.types import StubStatus
from tests.aio.flavours import FLAVOURS, Behaviour, Flavour, applied, env, inbox, journal, make_rel
from tests.conftest import _ensure_clean_schema
from tests.services import PrivateRedis

REDIS_MODES = ["redis", "no-redis"]


@pytest.fixture(params=FLAVOURS)
def flavour_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=REDIS_MODES)
def flavour(
    request: pytest.FixtureRequest, flavour_name: str, db_url: str, redis_url: str, key_prefix: str
) -> Iterator[Flavour]:
    """A flavour on a clean database, with the shared Redis or without any (database-only guard)."""
    rel = make_rel(db_url, redis_url if request.param == "redis" else None, key_prefix, max_attempts=3)
    f = Flavour(flavour_name, rel)
    yield f
    f.close()


def stage(rel: Reliability, message_id: str, groups: list[str], body: bytes = b"{}") -> None:
    """The producer's rows for a message: its stub and one PENDING inbox row per group."""
    from reliable import outbox

    now = utcnow()
    with rel.session() as s:
        outbox.stage(s, message_id, "orders", body, groups=groups, tags=None, now=now, resend_at=now)


def stub_status(rel: Reliability, message_id: str) -> StubStatus:
    from reliable import outbox

    with rel.engine.connect() as conn:
        status = outbox.stub_status(conn, message_id)
    assert status is not None
    return status


# --- duplicates ----------------------------------------------------------------------------------------


def test_redeliveries_are_suppressed_with_or_without_a_producer_row(flavour: Flavour) -> None:
    rel = flavour.rel
    stage(rel, "staged", ["g"])
    handle = flavour.guard()
    for mid in ("staged", "inbox-only"):
        first = flavour.decide(handle, env(mid))
        again = [flavour.decide(handle, env(mid, reconsume_times=n)) for n in (1, 2)]
        assert first.reason is Reason.PROCESSED
        assert all(d.duplicate and d.result is ConsumeResult.SUCCESS for d in again)
        assert inbox(rel, mid) == ("CONFIRMED", 0)
    assert applied(rel) == {"staged": 1, "inbox-only": 1}
    assert stub_status(rel, "staged") is StubStatus.CONFIRMED


def test_twins_in_one_batch_apply_once_in_any_order(flavour: Flavour) -> None:
    handle = flavour.guard()
    decisions = flavour.batch(handle, [env("b"), env("a"), env("b"), env("c"), env("a")])
    assert [d.reason for d in decisions] == [
        Reason.PROCESSED,
        Reason.PROCESSED,
        Reason.DUPLICATE_IN_BATCH,
        Reason.PROCESSED,
        Reason.DUPLICATE_IN_BATCH,
    ]
    later = flavour.batch(handle, [env("c"), env("a")])  # a later batch of known ids
    assert all(d.duplicate for d in later)
    assert applied(flavour.rel) == {"a": 1, "b": 1, "c": 1}


def test_concurrent_deliveries_of_one_id_apply_once(flavour: Flavour) -> None:
    stage(flavour.rel, "raced-staged", ["g"])
    handle = flavour.guard()
    runs = flavour.race(handle, [env(m) for m in ["raced", "raced-staged"] * 4])
    finals = [r[-1] for r in runs]
    assert all(d.result is ConsumeResult.SUCCESS for d in finals)
    assert sorted(d.reason is Reason.PROCESSED for d in finals).count(True) == 2  # one winner per id
    assert applied(flavour.rel) == {"raced": 1, "raced-staged": 1}


# --- failures ------------------------------------------------------------------------------------------


def test_a_failed_handler_rolls_back_then_the_redelivery_applies_once(flavour: Flavour) -> None:
    seen: set[str | None] = set()

    def first_time(e: object) -> bool:
        mid = getattr(e, "message_id", None)
        new = mid not in seen
        seen.add(mid)
        return new

    handle = flavour.guard(behaviour=Behaviour(fails=first_time))
    failed = flavour.decide(handle, env("flaky"))
    assert (failed.reason, failed.result, failed.attempts) == (
        Reason.HANDLER_FAILED,
        ConsumeResult.RECONSUME_LATER,
        1,
    )
    assert applied(flavour.rel) == {}  # the failed attempt's write was rolled back with the transaction
    ok = flavour.decide(handle, env("flaky", reconsume_times=1))
    assert ok.reason is Reason.PROCESSED
    assert applied(flavour.rel) == {"flaky": 1}
    assert [o for o, _ in journal(flavour.rel, "flaky")] == ["RETRY", "SUCCESS"]


def test_a_handler_that_always_fails_is_dead_lettered_after_max_attempts(flavour: Flavour) -> None:
    handle = flavour.guard(behaviour=Behaviour(fails=lambda e: True))
    reasons = [flavour.decide(handle, env("doomed", reconsume_times=n)).reason for n in range(3)]
    assert reasons == [Reason.HANDLER_FAILED, Reason.HANDLER_FAILED, Reason.MAX_ATTEMPTS]
    assert applied(flavour.rel) == {}
    assert journal(flavour.rel, "doomed")[-1][0] == "DEAD_LETTER"


# --- bad input -----------------------------------------------------------------------------------------


def test_a_different_body_under_a_known_id_is_dead_lettered(flavour: Flavour) -> None:
    handle = flavour.guard()
    assert flavour.decide(handle, env("m", b'{"amount": 10}')).reason is Reason.PROCESSED
    tampered = flavour.decide(handle, env("m", b'{"amount": 99}'))
    assert (tampered.reason, tampered.result) == (Reason.PAYLOAD_MISMATCH, ConsumeResult.DEAD_LETTER)
    twins = flavour.batch(handle, [env("n", b"1"), env("n", b"2")])  # batch twins are checked too
    assert [d.reason for d in twins] == [Reason.PROCESSED, Reason.PAYLOAD_MISMATCH]
    assert applied(flavour.rel) == {"m": 1, "n": 1}


def test_a_delivery_without_an_id_is_dead_lettered_and_never_handled(flavour: Flavour) -> None:
    b = Behaviour()
    handle = flavour.guard(behaviour=b)
    d = flavour.decide(handle, env(None))
    assert (d.reason, d.result) == (Reason.MISSING_MESSAGE_ID, ConsumeResult.DEAD_LETTER)
    assert b.calls == []


# --- fan-out ---------------------------------------------------------------------------------------------


def test_three_groups_each_apply_every_message_once(flavour: Flavour) -> None:
    groups = ["billing", "audit", "search"]
    ids = [f"f{i}" for i in range(4)]
    for mid in ids[:2]:
        stage(flavour.rel, mid, groups)  # two with producer rows for all three groups, two without
    handles = [flavour.guard(group=g) for g in groups]
    for _ in range(2):  # every message delivered twice to every group
        for h in handles:
            assert all(d.result is ConsumeResult.SUCCESS for d in flavour.batch(h, [env(m) for m in ids]))
    for g in groups:
        assert applied(flavour.rel, g) == dict.fromkeys(ids, 1)
    assert {stub_status(flavour.rel, m) for m in ids[:2]} == {StubStatus.CONFIRMED}


# --- Redis flushed and down (a private server: these tests flush and kill it) -------------------------------


def test_redis_flushed_then_down_never_lets_a_duplicate_through(
    flavour_name: str, db_url: str, private_redis: PrivateRedis, key_prefix: str
) -> None:
    rel = make_rel(db_url, private_redis.url, key_prefix, redis_socket_timeout_s=0.3)
    f = Flavour(flavour_name, rel)
    try:
        handle = f.guard(redis_retry_after_s=0.0)
        assert f.decide(handle, env("r1")).reason is Reason.PROCESSED
        assert f.decide(handle, env("r1")).reason is Reason.DUPLICATE_DONE_MARKER
        assert rel.redis is not None
        rel.redis.flushall()
        assert f.decide(handle, env("r1")).reason is Reason.DUPLICATE_CONFIRMED  # the database still knows
        private_redis.stop()
        assert f.decide(handle, env("r2")).reason is Reason.PROCESSED  # database alone
        assert f.decide(handle, env("r2")).reason is Reason.DUPLICATE_CONFIRMED
        private_redis.start()
        assert f.decide(handle, env("r3")).reason is Reason.PROCESSED
        assert applied(rel) == {"r1": 1, "r2": 1, "r3": 1}
    finally:
        f.close()


def test_the_sync_and_async_guards_of_one_group_share_rows_and_done_markers(
    db_url: str, redis_url: str, key_prefix: str
) -> None:
    rel = make_rel(db_url, redis_url, key_prefix)
    sync, aio = Flavour("sync", rel), Flavour("async", rel)
    try:
        s, a = sync.guard(), aio.guard()
        assert sync.decide(s, env("x")).reason is Reason.PROCESSED
        s.flush_markers()  # queued after the commit, not waited for: make them visible to the other guard
        assert aio.decide(a, env("x")).reason is Reason.DUPLICATE_DONE_MARKER
        assert aio.decide(a, env("y")).reason is Reason.PROCESSED
        aio.run(a.flush_markers())
        assert sync.decide(s, env("y")).reason is Reason.DUPLICATE_DONE_MARKER
        assert applied(rel) == {"x": 1, "y": 1}
    finally:
        aio.close()
        sync.close()


# --- a worker killed after its handler ran, before the commit ----------------------------------------------


@pytest.mark.slow
def test_a_worker_killed_before_the_commit_leaves_no_effect_and_the_redelivery_applies_once(
    flavour_name: str, db_url: str, redis_url: str, key_prefix: str
) -> None:
    import multiprocessing

    from tests.aio.flavours import child_killed_before_commit

    rel = make_rel(db_url, redis_url, key_prefix)
    child = multiprocessing.get_context("spawn").Process(
        target=child_killed_before_commit, args=(flavour_name, db_url, redis_url, key_prefix, "k")
    )
    child.start()
    child.join(60)
    assert child.exitcode == 3  # died inside the guard, after the handler's write
    f = Flavour(flavour_name, rel)
    try:
        assert applied(rel) == {}  # the handler's write was in the guard's uncommitted transaction
        runs = f.settled(f.guard(), env("k", reconsume_times=1))  # lease_conflict until the lease lapses
        assert runs[-1].reason is Reason.PROCESSED
        assert applied(rel) == {"k": 1}
    finally:
        f.close()


# --- a lease another worker holds ----------------------------------------------------------------------


def test_a_lease_conflict_reports_how_long_the_other_workers_lease_has_left(
    flavour_name: str, postgres_url: str, redis_url: str, key_prefix: str
) -> None:
    """The RabbitMQ adapters wait that long before requeueing (test_lease_conflict.py in
    tests/adapters/rabbitmq); a delivery that took the lease itself carries no wait."""
    _ensure_clean_schema(postgres_url)
    rel = make_rel(postgres_url, redis_url, key_prefix, lease_ms=10_000)
    f = Flavour(flavour_name, rel)
    try:
        handle = f.guard()
        assert rel.redis is not None
        rel.redis.set(lease_key(key_prefix, "g", "held"), "processing:deadhost:1:1:x", px=4000)
        rel.redis.set(lease_key(key_prefix, "g", "for-ever"), "processing:deadhost:1:1:y")
        held, for_ever = f.decide(handle, env("held")), f.decide(handle, env("for-ever"))
        assert held.reason is Reason.LEASE_CONFLICT and for_ever.reason is Reason.LEASE_CONFLICT
        assert held.retry_after_ms is not None and 3000 < held.retry_after_ms <= 4000
        assert for_ever.retry_after_ms == 10_000  # no expiry: one lease, not for ever
        assert f.decide(handle, env("free")).retry_after_ms is None
        assert applied(rel) == {"free": 1}
    finally:
        f.close()
