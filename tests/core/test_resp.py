"""The guard's packed Redis commands (:mod:`reliable.stores.resp`) against a real server.

What a user needs: any key and value survive the hand encoding byte for byte; an error reply in the middle of
a batch neither loses the replies around it nor leaves the pooled connection out of step for the next
caller; a connection pooled before a Redis restart is replaced without a failed call; a cluster client is
left to redis-py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis as redis_lib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reliable.stores import resp
from tests.services import PrivateRedis


@pytest.fixture
def client(redis_url: str) -> Iterator[redis_lib.Redis]:
    c = redis_lib.Redis.from_url(redis_url)
    yield c
    for key in c.scan_iter("resp-test:*"):
        c.delete(key)
    c.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.binary(min_size=1, max_size=300), value=st.binary(max_size=2000))
def test_any_key_and_value_arrive_byte_for_byte(client: redis_lib.Redis, key: bytes, value: bytes) -> None:
    raw = resp.RawCommands(client)
    k = b"resp-test:" + key
    assert raw.execute([(b"SET", k, value, b"PX", b"60000")]) == [b"OK"]
    assert client.get(k) == value
    assert raw.execute([("SET", k, "other", "NX", "PX", "60000", "GET")]) == [value]


def test_an_error_reply_mid_batch_keeps_the_connection_in_step(client: redis_lib.Redis) -> None:
    raw = resp.RawCommands(client)
    k = f"resp-test:{uuid.uuid4().hex}"
    with pytest.raises(redis_lib.ResponseError):
        raw.execute([("SET", k, "text"), ("INCR", k), ("SET", k + ":b", "b")])
    assert client.get(k + ":b") == b"b"  # the command after the error ran
    for _ in range(3):  # whichever pooled connection comes back, its next reply is its own
        assert raw.execute([("GET", k)]) == [b"text"]


def test_a_connection_pooled_before_a_restart_is_replaced(private_redis: PrivateRedis) -> None:
    client = redis_lib.Redis.from_url(private_redis.url, socket_timeout=2)
    raw = resp.RawCommands(client)
    assert raw.execute([("SET", "resp-test:a", "1")]) == [b"OK"]
    private_redis.stop()
    private_redis.start()
    assert raw.execute([("SET", "resp-test:a", "2", "GET")]) == [None]  # a fresh server, and no error
    client.close()


def test_a_cluster_client_is_left_to_redis_py() -> None:
    from redis.cluster import RedisCluster

    assert resp.for_client(redis_lib.Redis()) is not None
    assert resp.for_client(RedisCluster.__new__(RedisCluster)) is None
