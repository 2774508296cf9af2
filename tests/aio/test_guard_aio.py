"""What only the asyncio flavour can get wrong: many tasks on one loop, cancellation, the loop itself."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace

import pytest
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncSession

from reliable import ConsumeResult, Envelope, Reliability, idempotent_consumer
from reliable.errors import ConfigurationError
from reliable.guard import Reason
from reliable.guard.aio import AsyncGuardedHandler
from reliable.stores.lease import lease_key
from tests.aio.flavours import Flavour, applied, env, inbox, journal, ledger, make_rel
from tests.conftest import _ensure_clean_schema
from tests.waiting import LOCK_WAITS

TASKS = 64


@pytest.fixture
def rel(db_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    r = make_rel(db_url, redis_url, key_prefix, lease_ms=60_000)
    yield r
    r.close()


def test_many_tasks_on_one_loop_racing_on_one_id_apply_it_once(rel: Reliability) -> None:
    f = Flavour("async", rel)
    try:
        handle = f.guard()
        runs = f.race(handle, [env("hot") for _ in range(TASKS)] + [env(f"cold-{i}") for i in range(8)])
        assert all(r[-1].result is ConsumeResult.SUCCESS for r in runs)
        assert [r[-1].reason for r in runs[:TASKS]].count(Reason.PROCESSED) == 1
        assert applied(rel) == {"hot": 1} | {f"cold-{i}": 1 for i in range(8)}
    finally:
        f.close()


def test_a_task_cancelled_mid_handler_rolls_back_and_leaves_the_message_retryable(rel: Reliability) -> None:
    entered = asyncio.Event()
    release = asyncio.Event()

    @idempotent_consumer(rel, group="g")
    async def handle(e: Envelope, session: AsyncSession) -> None:
        await session.execute(insert(ledger).values(message_id=e.message_id, grp="g"))
        if e.reconsume_times == 0:
            entered.set()
            await release.wait()  # never set: the task is cancelled here, its write not yet committed

    async def scenario() -> ConsumeResult:
        task = asyncio.create_task(handle(env("c")))
        await asyncio.wait_for(entered.wait(), 20)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert applied(rel) == {}  # rolled back
        assert inbox(rel, "c") == ("PENDING", 1)  # not confirmed; the cancelled attempt counts as a failure
        result = await handle(env("c", reconsume_times=1))  # retryable at once: the lease was released
        await rel.aclose()
        return result

    assert asyncio.run(scenario()) is ConsumeResult.SUCCESS
    assert applied(rel) == {"c": 1}
    assert [o for o, _ in journal(rel, "c")] == ["RETRY", "SUCCESS"]


def test_a_cancelled_error_its_task_did_not_get_is_an_ordinary_handler_failure(
    db_url: str, redis_url: str, key_prefix: str
) -> None:
    """A handler awaits a future that a client library cancelled: ``CancelledError`` comes out, but nobody
    cancelled the task. Taken for a cancel of the task it was raised to the adapter (which catches
    ``Exception``: the message neither acknowledged nor requeued, or an aiokafka consumer stopped), and at
    the last attempt the row ended DEAD while the caller got ``CancelledError``. It is a failure like any
    other: retried, then dead-lettered with the reason."""
    rel = make_rel(db_url, redis_url, key_prefix, max_attempts=2)

    @idempotent_consumer(rel, group="g")
    async def handle(e: Envelope, session: AsyncSession) -> None:
        await session.execute(insert(ledger).values(message_id=e.message_id, grp="g"))
        inner = asyncio.get_running_loop().create_future()
        inner.cancel()  # a library's request, cancelled under the handler
        await inner

    async def scenario() -> list[ConsumeResult]:
        results = [await handle(env("s", reconsume_times=n)) for n in range(2)]
        await rel.aclose()
        return results

    try:
        assert asyncio.run(scenario()) == [ConsumeResult.RECONSUME_LATER, ConsumeResult.DEAD_LETTER]
        assert applied(rel) == {}
        assert inbox(rel, "s") == ("DEAD", 2)
        assert [o for o, _ in journal(rel, "s")] == ["RETRY", "DEAD_LETTER"]
    finally:
        rel.close()


def test_a_service_stopping_during_the_brokers_last_delivery_does_not_dead_letter_the_message(
    rel: Reliability,
) -> None:
    """The worker's task is cancelled (``asyncio.run`` ending, a shutdown) while its handler runs the broker's
    last delivery (a Kafka record on its last retry topic). The handler did not fail: the row stays PENDING
    for the sweeper to re-send once stuck, instead of DEAD with a person told and every later copy answered
    ``gave_up`` — the message never applied."""
    entered, release = asyncio.Event(), asyncio.Event()

    @idempotent_consumer(rel, group="g")
    async def handle(e: Envelope, session: AsyncSession) -> None:
        await session.execute(insert(ledger).values(message_id=e.message_id, grp="g"))
        if e.last_attempt:
            entered.set()
            await release.wait()  # never set: the service stops here

    async def scenario() -> ConsumeResult:
        task = asyncio.create_task(handle(replace(env("last"), last_attempt=True)))
        await asyncio.wait_for(entered.wait(), 20)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert inbox(rel, "last") == ("PENDING", 1)
        result = await handle(env("last"))  # the sweeper's copy, after a restart
        await rel.aclose()
        return result

    assert asyncio.run(scenario()) is ConsumeResult.SUCCESS
    assert applied(rel) == {"last": 1}


def test_the_decorator_returns_an_awaitable_guard_for_async_def(rel: Reliability) -> None:
    @idempotent_consumer(rel, group="g")
    async def on_order(e: Envelope, session: AsyncSession) -> None:
        """Docstring kept."""

    assert isinstance(on_order, AsyncGuardedHandler)
    assert (on_order.__name__, on_order.__doc__, on_order.group) == ("on_order", "Docstring kept.", "g")

    async def scenario() -> list[ConsumeResult]:
        out = [await on_order(env("d1")), *await on_order.batch([env("d1"), env("d2")])]
        await rel.aclose()
        return out

    assert asyncio.run(scenario()) == [ConsumeResult.SUCCESS] * 3


def test_each_event_loop_gets_its_own_connections(rel: Reliability) -> None:
    """A guarded handler used from two loops in turn (asyncio.run twice) works in both."""

    @idempotent_consumer(rel, group="g")
    async def handle(e: Envelope, session: AsyncSession) -> None:
        await session.execute(insert(ledger).values(message_id=e.message_id, grp="g"))

    assert asyncio.run(handle(env("l1"))) is ConsumeResult.SUCCESS
    assert asyncio.run(handle(env("l2"))) is ConsumeResult.SUCCESS
    assert applied(rel) == {"l1": 1, "l2": 1}


def test_write_behind_is_refused_for_async_handlers(sqlite_url: str) -> None:
    rel = Reliability(sqlite_url, journal_write_behind=True)

    async def h(e: Envelope, session: AsyncSession) -> None: ...

    try:
        with pytest.raises(ConfigurationError, match="journal_write_behind"):
            idempotent_consumer(rel, group="g")(h)
    finally:
        rel.close()


# --- shutting a loop down: the done markers queued after the last commits still reach Redis ---------------


def test_a_consumer_restarted_right_after_its_last_delivery_answers_the_redelivery_from_redis(
    rel: Reliability,
) -> None:
    """A worker stops (its ``asyncio.run`` ends) right after committing a message; the broker, which had not
    recorded the ack yet, hands the message to the restarted worker. It must be answered as a duplicate
    by the ``done`` marker the gone worker had queued, in one Redis round trip — not by a database check
    because the gone worker's lease was left in Redis in place of the marker."""

    @idempotent_consumer(rel, group="g")
    async def handle(e: Envelope, session: AsyncSession) -> None:
        await session.execute(insert(ledger).values(message_id=e.message_id, grp="g"))

    last = asyncio.run(handle.decide(env("r")))  # the worker's last delivery before it stops
    assert last.reason is Reason.PROCESSED
    again = asyncio.run(handle.decide(env("r")))  # the restarted worker's first delivery
    assert (again.result, again.reason) == (ConsumeResult.SUCCESS, Reason.DUPLICATE_DONE_MARKER)
    assert applied(rel) == {"r": 1}


def test_aclose_sends_the_queued_done_markers_and_leaves_no_task_behind(rel: Reliability) -> None:
    """A loop run by hand: ``await rel.aclose()`` sends the markers still queued and stops the task that
    would have sent them, so the loop closes with nothing pending (no "Task was destroyed but it is
    pending!", no traceback from a Redis call cut off at the loop's close)."""

    @idempotent_consumer(rel, group="g")
    async def handle(e: Envelope, session: AsyncSession) -> None:
        await session.execute(insert(ledger).values(message_id=e.message_id, grp="g"))

    async def leftover() -> set[asyncio.Task[object]]:
        return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}

    loop = asyncio.new_event_loop()
    try:
        for m in ("m1", "m2"):  # the loop goes on after an aclose: new connections, and closed again
            assert loop.run_until_complete(handle.decide(env(m))).reason is Reason.PROCESSED
            loop.run_until_complete(rel.aclose())
            assert loop.run_until_complete(leftover()) == set()
    finally:
        loop.close()
    assert rel.redis is not None
    markers = [rel.redis.get(lease_key(rel.settings.key_prefix, "g", m)) for m in ("m1", "m2")]
    assert all(isinstance(v, bytes) and v.startswith(b"done") for v in markers), markers


@pytest.mark.parametrize("backend", ["postgres", "mariadb"])  # SQLite's lock wait cannot be seen from outside
def test_a_worker_cancelled_while_its_guard_waits_on_a_row_lock_is_cancelled(
    backend: str, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    """A service shutting down cancels a worker whose guard waits on another delivery's row lock: the cancel
    reaches the worker, which does not go on to its next message, and nothing of the cancelled delivery is
    committed. asyncmy (MariaDB) turns a cancel into a driver error of its own, which the guard answered as a
    database outage, and the worker carried on."""
    db_url: str = request.getfixturevalue(f"{backend}_url")
    _ensure_clean_schema(db_url)
    rel = make_rel(db_url, "", key_prefix)  # no Redis: the redelivery goes to the database and waits there
    lock_waits = text(LOCK_WAITS[rel.engine.dialect.name])
    entered, release = asyncio.Event(), asyncio.Event()

    @idempotent_consumer(rel, group="g")
    async def handle(e: Envelope, session: AsyncSession) -> None:
        await session.execute(insert(ledger).values(message_id=e.message_id, grp="g"))
        if e.message_id == "held" and e.reconsume_times == 0:
            entered.set()
            await release.wait()  # holds the group's inbox row until the worker has been cancelled

    async def waiting_on_a_lock() -> None:
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            with rel.engine.connect() as conn:
                if conn.execute(lock_waits).scalar_one():
                    return
            assert asyncio.get_running_loop().time() < deadline, "the worker never waited on the row lock"
            await asyncio.sleep(0.02)

    async def scenario() -> list[Reason]:
        holder = asyncio.create_task(handle.decide(env("held")))
        await asyncio.wait_for(entered.wait(), 20)
        went_on: list[Reason] = []

        async def worker() -> None:
            for e in (env("held", reconsume_times=1), env("next")):
                went_on.append((await handle.decide(e)).reason)

        task = asyncio.create_task(worker())
        await waiting_on_a_lock()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        assert (await holder).reason is Reason.PROCESSED
        await rel.aclose()
        return went_on

    try:
        assert asyncio.run(scenario()) == []
        assert applied(rel) == {"held": 1}
    finally:
        rel.close()
