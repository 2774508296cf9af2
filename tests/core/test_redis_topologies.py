"""The guard on managed Redis: Sentinel (with a master failover) and a 3-master Cluster, real servers.

What a user needs: pointing ``RELIABLE_REDIS_URL`` at their Sentinel group or Cluster just works — every
message applied once, duplicates answered by Redis — and a Sentinel failover costs no correctness, only a
few deliveries decided by the database while the replica is promoted.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import quote

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from redis.cluster import RedisCluster
from sqlalchemy.orm import Session

from reliable import Envelope, Reason, Reliability, idempotent_consumer
from reliable.decorator import GuardedHandler
from reliable.errors import ConfigurationError
from reliable.redis_connect import parse_topology
from tests.core.guard_helpers import applied, apply, env, make_rel
from tests.redis_topologies import (
    Cluster,
    SentinelGroup,
    answering,
    cluster_port,
    redis_cluster,
    redis_sentinel,
)
from tests.scripted_server import ScriptedServer
from tests.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_sentinel_and_cluster_urls_parse() -> None:
    s = parse_topology("redis+sentinel://:s3cret@10.0.0.1:26379,sent-2:26380/billing-cache/2")
    assert (s.kind, s.nodes, s.service_name, s.db, s.password) == (
        "sentinel",
        [("10.0.0.1", 26379), ("sent-2", 26380)],
        "billing-cache",
        2,
        "s3cret",
    )
    own = parse_topology("redis+sentinel://:m@h:1/svc?sentinel_password=s%26t&sentinel_username=watch")
    assert (own.password, own.sentinel_password, own.sentinel_username) == ("m", "s&t", "watch")
    c = parse_topology("rediss+cluster://a:7000,b:7001")
    assert (c.kind, c.nodes, c.tls) == ("cluster", [("a", 7000), ("b", 7001)], True)
    for bad in (
        "redis+sentinel://h:26379",  # no service name
        "redis+sentinel://h:26379/svc/x",
        "redis+cluster://h:7000/3",  # clusters have db 0 only
        "redis+cluster://h",
        "redis+sentinel://h:1/svc?sentinel_pasword=typo",  # unknown parameters are refused, not ignored
        "redis+sentinel://h:1/svc?sentinel_password=a&sentinel_password=b",
        "redis+cluster://h:7000?sentinel_password=x",
    ):
        with pytest.raises(ConfigurationError):
            parse_topology(bad)
    with pytest.raises(ConfigurationError, match="unknown scheme"):
        Reliability("sqlite://", redis_url="memcached://h:1")


_host = st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z0-9-]{1,10}){0,2}", fullmatch=True)
_nodes = st.lists(st.tuples(_host, st.integers(1, 65535)), min_size=1, max_size=4)


@given(
    nodes=_nodes,
    service=st.from_regex(r"[A-Za-z0-9_.-]{1,30}", fullmatch=True),
    db=st.integers(0, 15),
    password=st.none() | st.text(min_size=1, max_size=12),
    tls=st.booleans(),
)
def test_sentinel_urls_round_trip(
    nodes: list[tuple[str, int]], service: str, db: int, password: str | None, tls: bool
) -> None:
    auth = f":{quote(password, safe='')}@" if password else ""
    hosts = ",".join(f"{h}:{p}" for h, p in nodes)
    url = f"{'rediss' if tls else 'redis'}+sentinel://{auth}{hosts}/{service}/{db}"
    t = parse_topology(url)
    assert (t.kind, t.nodes, t.service_name, t.db, t.password, t.tls) == (
        "sentinel",
        nodes,
        service,
        db,
        password,
        tls,
    )
    assert parse_topology(f"redis+cluster://{auth}{hosts}").nodes == nodes


def guard(rel: Reliability, group: str = "billing") -> GuardedHandler:
    @idempotent_consumer(rel, group=group, registry=CollectorRegistry(), redis_retry_after_s=0.05)
    def handle(e: Envelope, session: Session) -> None:
        apply(e, session)

    return handle


def reasons(handle: GuardedHandler, ids: Sequence[str]) -> list[Reason]:
    return [d.reason for d in handle.decide_batch([env(m) for m in ids])]


@pytest.fixture
def clean_sqlite(sqlite_url: str) -> str:
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    return sqlite_url


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with redis_cluster() as c:
        yield c


@pytest.fixture
def sentinel() -> Iterator[SentinelGroup]:
    with redis_sentinel() as s:
        yield s


def test_guard_on_a_three_master_cluster(cluster: Cluster, clean_sqlite: str, key_prefix: str) -> None:
    rel = make_rel(clean_sqlite, cluster.url, key_prefix)
    try:
        assert isinstance(rel.redis, RedisCluster)
        handle = guard(rel)
        ids = [f"c-{i}-{uuid.uuid4().hex[:6]}" for i in range(24)]
        assert set(reasons(handle, ids)) == {Reason.PROCESSED}  # one batch: the pipeline spans slots
        assert [handle.decide(env(m)).reason for m in ids[:4]] == [Reason.DUPLICATE_DONE_MARKER] * 4
        assert set(reasons(handle, ids)) == {Reason.DUPLICATE_DONE_MARKER}, "batch of duplicates via Redis"
        assert applied(rel) == len(ids)
        # the sweeper's lease read pipelines GET + PTTL over keys of every slot: a live lease is seen as
        # live (with its time left), the done markers as not live, and Redis answered for every key
        from reliable.sweeper.leases import RoundLeases

        held = f"held-{uuid.uuid4().hex[:6]}"
        rel.redis.set(f"{key_prefix}:billing:{held}", "processing:other-worker", px=60_000)
        keys = [("billing", m) for m in (held, *ids)]
        views = RoundLeases(rel.redis, key_prefix, dt.timedelta(seconds=1)).read(keys)
        assert views[0].remaining is not None and views[0].remaining.total_seconds() > 0
        assert all(v.remaining is None for v in views[1:]), "done markers are not live leases"
        assert not {getattr(v.state, "name", None) for v in views} & {"UNKNOWN", "UNAVAILABLE"}
        # the keys really are sharded: every master holds some of them
        per_node = [len(n.client().keys(f"{key_prefix}:*")) for n in cluster.nodes]
        assert sum(per_node) == len(ids) + 1 and all(per_node), per_node
    finally:
        rel.close()


def test_a_dead_cluster_master_leaves_the_guard_on_the_database(
    cluster: Cluster, clean_sqlite: str, key_prefix: str
) -> None:
    """Keys of the dead master's slots (and the cluster client's own errors) are "Redis down": the database
    decides, nothing is applied twice, no exception reaches the caller."""
    rel = make_rel(clean_sqlite, cluster.url, key_prefix)
    try:
        handle = guard(rel)
        warm = [f"w-{i}-{uuid.uuid4().hex[:6]}" for i in range(6)]
        assert set(reasons(handle, warm)) == {Reason.PROCESSED}
        cluster.nodes[2].kill()
        ids = [f"k-{i}-{uuid.uuid4().hex[:6]}" for i in range(12)]
        assert set(reasons(handle, ids)) == {Reason.PROCESSED}
        for node in cluster.nodes:  # the whole cluster gone: the client cannot even find a node
            node.kill()
        late = [f"l-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
        assert set(reasons(handle, late)) == {Reason.PROCESSED}
        assert all(d.duplicate for d in handle.decide_batch([env(m) for m in warm + ids + late]))
        assert applied(rel) == len(warm) + len(ids) + len(late)
    finally:
        rel.close()


def test_a_cluster_that_does_not_answer_at_start_up_is_picked_up_once_it_does(
    clean_sqlite: str, key_prefix: str
) -> None:
    """``RedisCluster(...)`` reads the slot map when it is made: a consumer started during a Redis
    maintenance window raised RedisClusterException and crash-looped, though the database alone decides.
    It starts, decides on the database, and uses the cluster once it answers."""
    ports = [cluster_port() for _ in range(3)]
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports[:2])
    rel = make_rel(clean_sqlite, url, key_prefix)  # nothing listens on those ports yet
    try:
        handle = idempotent_consumer(rel, group="billing", redis_retry_after_s=0.05)(apply)
        early = f"early-{uuid.uuid4().hex[:6]}"
        assert handle.decide(env(early)).reason is Reason.PROCESSED  # the database alone
        with redis_cluster(ports=ports):
            late = f"late-{uuid.uuid4().hex[:6]}"

            def decided_with_redis() -> bool:
                mid = f"{late}-{uuid.uuid4().hex[:4]}"
                handle.decide(env(mid))
                return handle.decide(env(mid)).reason is Reason.DUPLICATE_DONE_MARKER

            wait_until(decided_with_redis, what="the guard using the cluster that came up")
        assert handle.decide(env(early)).duplicate
    finally:
        rel.close()


def done_on(server_client: redis.Redis, key_prefix: str) -> Callable[[str], bool]:
    return lambda mid: bool(server_client.get(f"{key_prefix}:billing:{mid}"))


def test_guard_survives_a_sentinel_failover_applying_each_message_once(
    sentinel: SentinelGroup, clean_sqlite: str, key_prefix: str
) -> None:
    rel = make_rel(clean_sqlite, sentinel.url, key_prefix)
    try:
        handle = guard(rel)
        before = [f"b-{i}-{uuid.uuid4().hex[:6]}" for i in range(10)]
        assert set(reasons(handle, before)) == {Reason.PROCESSED}
        assert all(map(done_on(sentinel.master.client(), key_prefix), before))

        sentinel.master.kill()  # the master is gone; the sentinel has not noticed yet
        during = [f"d-{i}-{uuid.uuid4().hex[:6]}" for i in range(10)]
        assert set(reasons(handle, during)) == {Reason.PROCESSED}, "the database decides alone meanwhile"
        assert set(reasons(handle, before)) == {Reason.DUPLICATE_CONFIRMED}

        new_master = sentinel.fail_over()
        after: list[str] = []

        def redis_is_used_again() -> bool:
            mid = f"a-{len(after)}-{uuid.uuid4().hex[:6]}"
            after.append(mid)
            assert handle.decide(env(mid)).reason is Reason.PROCESSED
            return done_on(new_master.client(), key_prefix)(mid)

        wait_until(answering(redis_is_used_again), what="the guard to use the promoted master")
        everything = before + during + after
        assert all(d.duplicate for d in handle.decide_batch([env(m) for m in everything])), (
            "every redelivery after the failover is a duplicate"
        )
        assert applied(rel) == len(everything)
        for mid in everything:
            assert applied(rel, mid) == 1, mid
    finally:
        rel.close()


@pytest.mark.parametrize(
    ("master_password", "sentinel_password"), [("m-pw", "s-pw"), ("m-pw", None)], ids=["own", "none"]
)
def test_sentinels_get_their_own_password_and_never_the_masters(
    clean_sqlite: str, key_prefix: str, master_password: str, sentinel_password: str | None
) -> None:
    """A sentinel with ``requirepass`` gets ``?sentinel_password=`` (it got nothing: MasterNotFoundError on
    every call, the guard silently on the database alone); one without a password gets no AUTH at all (it
    refuses one), whatever the master's password — sync and asyncio clients."""
    from reliable.redis_connect import connect_topology_async

    with redis_sentinel(
        replica=False, master_password=master_password, sentinel_password=sentinel_password
    ) as group:
        rel = make_rel(clean_sqlite, group.url, key_prefix)
        try:
            mid = f"pw-{uuid.uuid4().hex[:6]}"
            assert guard(rel).decide(env(mid)).reason is Reason.PROCESSED
            assert done_on(group.master.client(), key_prefix)(mid), "the guard used Redis"
        finally:
            rel.close()

        async def through_async() -> Any:
            client = connect_topology_async(parse_topology(group.url), 2.0)
            try:
                await client.set(f"{key_prefix}:async", "v")
                return await client.get(f"{key_prefix}:async")
            finally:
                await client.aclose()

        assert asyncio.run(through_async()) == b"v"


def test_asyncio_clients_for_both_topologies(
    cluster: Cluster, sentinel: SentinelGroup, key_prefix: str
) -> None:
    """What the asyncio guard needs from either topology: NX-set with GET, a one-key script, a pipeline."""
    import asyncio

    from reliable.redis_connect import connect_topology_async

    async def exercise(url: str) -> list[Any]:
        client = connect_topology_async(parse_topology(url), 2.0)
        try:
            keys = [f"{key_prefix}:g:{i}" for i in range(12)]
            pipe = client.pipeline(transaction=False)
            for k in keys:
                pipe.set(k, "processing:me", nx=True, px=60_000, get=True)
            first = await pipe.execute()
            again = await client.set(keys[0], "processing:other", nx=True, px=60_000, get=True)
            cad = client.register_script(
                "return redis.call('GET', KEYS[1]) == ARGV[1] and redis.call('DEL', KEYS[1]) or 0"
            )
            deleted = await cad(keys=[keys[1]], args=["processing:me"])
            return [first, again, deleted]
        finally:
            await client.aclose()

    for url in (cluster.url, sentinel.url):
        first, again, deleted = asyncio.run(exercise(url))
        assert first == [None] * 12 and again == b"processing:me" and deleted == 1, url


def test_with_no_sentinel_answering_a_command_tries_each_once_not_with_backoff() -> None:
    """redis-py retries a failed command with exponential backoff by default: with every sentinel down, each
    call the guard's breaker let through blocked ≈ 4 s instead of one socket timeout, and a consumer spent
    most of an outage waiting. One try per sentinel and command, sync and asyncio."""
    from reliable.redis_connect import connect, connect_topology_async

    refusing = ScriptedServer()  # accepts and closes: a sentinel that answers nothing
    url = f"redis+sentinel://127.0.0.1:{refusing.port}/svc/0"
    try:
        client = connect(url, 0.5)
        with pytest.raises(redis.RedisError):
            client.set("k", "v")
        assert refusing.accepted == 1
        aio = connect_topology_async(parse_topology(url), 0.5)

        async def one() -> None:
            with pytest.raises(redis.RedisError):
                await aio.set("k", "v")

        asyncio.run(one())
        assert refusing.accepted == 2
    finally:
        refusing.close()
