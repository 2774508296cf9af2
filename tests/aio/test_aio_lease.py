"""The redis.asyncio lease store shares keys, values and answers with the sync store on one server."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import warnings

import redis as redis_lib
import redis.asyncio as aioredis

from reliable.stores import LeaseState
from reliable.stores.aio_lease import AsyncRedisLeaseStore
from reliable.stores.lease import RedisLeaseStore, done_value, lease_key, processing_value
from tests.services import PrivateRedis
from tests.waiting import wait_until


def test_sync_and_async_workers_see_each_others_leases_and_done_markers(
    redis_url: str, key_prefix: str
) -> None:
    sync = RedisLeaseStore(redis_lib.Redis.from_url(redis_url))
    a, b = lease_key(key_prefix, "g", "m-a"), lease_key(key_prefix, "g", "m-b")

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        store = AsyncRedisLeaseStore(client)
        mine = processing_value("async-owner")
        assert [x.state for x in await store.acquire_many([a], [mine], 60_000)] == [LeaseState.ACQUIRED]
        # the sync store finds the async worker's lease …
        assert sync.acquire_many([a], [processing_value("sync")], 60_000)[0].state is LeaseState.HELD
        # … and the async store finds the sync worker's done marker, with its payload tag
        sync.acquire_many([b], [processing_value("sync")], 60_000)
        sync.mark_done_many([(b, done_value("ab" * 32))], 60)
        sync.flush()  # markers are queued after the commit, not waited for: send it before the other looks
        answer = (await store.acquire_many([b], [mine], 60_000))[0]
        assert (answer.state, answer.done_hash) == (LeaseState.DONE, "ab" * 8)
        # compare-and-delete: a value that is not ours leaves the lease alone; ours frees it
        await store.release(a, processing_value("someone-else"))
        assert await client.get(a) == mine.encode()
        await store.release(a, mine)
        assert await client.get(a) is None
        await store.mark_done_many([(a, done_value(None))], 60)
        assert sync.acquire_many([a], ["x"], 60_000)[0].state is LeaseState.DONE
        await client.delete(a, b)
        await client.aclose()

    asyncio.run(scenario())


def test_a_dead_redis_is_unavailable_and_the_circuit_stays_open(private_redis: PrivateRedis) -> None:
    now = [100.0]
    fallbacks: list[str] = []

    async def scenario() -> None:
        client = aioredis.Redis.from_url(private_redis.url, socket_timeout=0.5, socket_connect_timeout=0.5)
        store = AsyncRedisLeaseStore(
            client, retry_after_s=5.0, on_fallback=lambda op, exc: fallbacks.append(op), clock=lambda: now[0]
        )
        assert (await store.acquire_many(["k"], ["v"], 1000))[0].state is LeaseState.ACQUIRED
        private_redis.stop()
        assert (await store.acquire_many(["k2"], ["v"], 1000))[0].state is LeaseState.UNAVAILABLE
        private_redis.start()  # back, but the circuit is open until retry_after_s has passed
        assert (await store.acquire_many(["k3"], ["v"], 1000))[0].state is LeaseState.UNAVAILABLE
        now[0] += 5.1
        assert (await store.acquire_many(["k4"], ["v"], 1000))[0].state is LeaseState.ACQUIRED
        await client.aclose()

    asyncio.run(scenario())
    assert fallbacks == ["acquire", "acquire"]


def test_a_loop_closed_right_after_done_markers_were_queued_leaves_no_unawaited_flush(
    redis_url: str, key_prefix: str
) -> None:
    """The loop stops in the very iteration in which the flush is due, then closes (what a test runner or
    an application that manages its own loop does): no flush coroutine may be left that never started."""
    loop = asyncio.new_event_loop()
    store = AsyncRedisLeaseStore(aioredis.Redis.from_url(redis_url), done_flush_ms=0)

    async def commit_one(s: AsyncRedisLeaseStore) -> None:  # the guard queues the marker, then returns
        s.queue_done([(lease_key(key_prefix, "g", "m-closing"), done_value(None))], 60)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loop.run_until_complete(commit_one(store))
        loop.close()
        del store, loop  # whatever task the store left behind is collected here
        gc.collect()
    unawaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert unawaited == []


class _TornDown(aioredis.Redis):
    """Fault injection: a real client whose commands fail as redis.asyncio's cluster client does on a
    connection another task tore down when a node died (an ``AttributeError``, not a ``RedisError``)."""

    async def execute_command(self, *args: object, **options: object) -> object:
        raise AttributeError("'NoneType' object has no attribute 'writelines'")


def test_a_client_error_that_is_not_a_redis_error_leaves_the_guard_on_the_database(redis_url: str) -> None:
    """It escaped the guard to the caller; the store's contract is that any Redis trouble is ``UNAVAILABLE``
    (the database decides) and opens the breaker."""
    fallbacks: list[str] = []

    async def scenario() -> None:
        client = _TornDown.from_url(redis_url)
        store = AsyncRedisLeaseStore(client, on_fallback=lambda op, exc: fallbacks.append(op))
        assert (await store.acquire_many(["k"], ["v"], 1000))[0].state is LeaseState.UNAVAILABLE
        store.breaker.succeeded()
        await store.release("k", "v")
        await client.aclose()

    asyncio.run(scenario())
    assert fallbacks == ["acquire", "release"]


def test_a_retried_acquire_that_finds_our_own_value_is_acquired(redis_url: str, key_prefix: str) -> None:
    """A retried ``SET NX GET`` whose first attempt reached the server returns our own value: that is our
    lease (ACQUIRED, as in the sync store), not another worker's (HELD → LEASE_CONFLICT on every try)."""
    key, mine = lease_key(key_prefix, "g", "m-retried"), processing_value("async-owner")

    async def scenario() -> list[LeaseState]:
        client = aioredis.Redis.from_url(redis_url)
        try:
            await client.set(key, mine, px=60_000)  # the first attempt's write, its reply lost
            store = AsyncRedisLeaseStore(client)
            single = (await store.acquire_many([key], [mine], 60_000))[0].state
            other = lease_key(key_prefix, "g", "m-other")
            batch = [a.state for a in await store.acquire_many([key, other], [mine, mine], 60_000)]
            await client.delete(key, other)
            return [single, *batch]
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == [LeaseState.ACQUIRED] * 3


def test_a_lease_set_after_the_client_gave_up_is_deleted_once_redis_answers(
    private_redis: PrivateRedis, key_prefix: str
) -> None:
    """As in the sync store: an acquire whose reply never came (the server stopped) may have set our lease
    anyway; the next call that reaches Redis compare-and-deletes it, so a redelivery is not LEASE_CONFLICT
    for ``lease_ms``. A lease someone else holds under that key meanwhile is left alone."""
    assert private_redis.proc is not None
    pid = private_redis.proc.pid
    now = [100.0]
    admin = redis_lib.Redis.from_url(private_redis.url, socket_timeout=5)
    stray, theirs = lease_key(key_prefix, "g", "m-stray"), lease_key(key_prefix, "g", "m-theirs")
    mine = processing_value("async-owner")

    async def scenario() -> list[LeaseState]:
        client = aioredis.Redis.from_url(private_redis.url, socket_timeout=0.2, socket_connect_timeout=0.2)
        store = AsyncRedisLeaseStore(client, retry_after_s=5.0, clock=lambda: now[0])
        try:
            await client.ping()  # connected: the acquire's write reaches the stopped server's socket
            os.kill(pid, signal.SIGSTOP)
            try:
                lost = await store.acquire_many([stray, theirs], [mine, mine], 60_000)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert [a.state for a in lost] == [LeaseState.UNAVAILABLE] * 2
            wait_until(lambda: admin.get(stray) == mine.encode(), what="the late lease write to land")
            admin.set(theirs, "processing:someone-else", px=60_000)
            now[0] += 10  # the breaker lets the next call through
            fresh = lease_key(key_prefix, "g", "m-fresh")
            answers = [a.state for a in await store.acquire_many([fresh], [mine], 60_000)]
            return answers + [a.state for a in await store.acquire_many([stray], ["again"], 60_000)]
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == [LeaseState.ACQUIRED, LeaseState.ACQUIRED]
    assert admin.get(theirs) == b"processing:someone-else"
