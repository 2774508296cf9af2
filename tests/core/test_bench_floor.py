"""The floor bench (``python -m bench floor``) is only a floor if it does the guard's durable work.

It claims to send the guard's traffic for a new message with nothing around it; if the guard's statements,
parameters or Redis values drift from what the floor binds, its figure stops meaning "the least the guard's
round trips cost". So: one message through the guard and one through the floor, for each path (inbox claim,
producer stub), must leave the same rows in every table the guard writes and the same Redis state.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_lib
from sqlalchemy import text

from bench.bench_core import guarded
from bench.bench_floor import PAYLOAD_HASH, WireFloor
from bench.harness import add_stubs, make_rel
from reliable import Envelope, Reliability
from reliable.stores.lease import lease_key

LOG = "topic, queue_id, queue_offset, reconsume_times, outcome, reason, original_topic, broker_name"
INBOX = (
    "status, attempts, payload_hash, resend_count, confirmed_at IS NOT NULL, first_received_at IS NOT NULL"
)
PROGRESS = "topic, broker_name, queue_id, max_offset, min_offset, received_count"


@pytest.fixture
def rel(postgres_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    r = make_rel(postgres_url, key_prefix, redis_url)  # the test's Redis, as the floor's below
    yield r
    r.close()


def written(rel: Reliability, group: str, message_id: str) -> dict[str, Any]:
    """Everything the guard's path writes for (group, message_id), without ids, workers and timestamps."""
    one = {"g": group, "m": message_id}
    with rel.engine.connect() as conn:

        def rows(sql: str, **params: object) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in conn.execute(text(sql), params or one)]

        return {
            "log": rows(f"SELECT {LOG} FROM message_log WHERE consumer_group = :g AND message_id = :m"),
            "inbox": rows(f"SELECT {INBOX} FROM message_inbox WHERE consumer_group = :g AND message_id = :m"),
            "stub": rows(
                "SELECT status, confirmed_at IS NOT NULL FROM message_stub WHERE message_id = :m",
                m=message_id,
            ),
            "progress": rows(f"SELECT {PROGRESS} FROM consume_progress WHERE consumer_group = :g", g=group),
            "ledger": rows("SELECT count(*) FROM bench_ledger WHERE message_id = :m", m=message_id),
        }


@pytest.mark.parametrize("stub", [False, True], ids=["inbox claim", "producer stub"])
def test_the_floor_writes_what_the_guard_writes(
    rel: Reliability, postgres_url: str, redis_url: str, key_prefix: str, stub: bool
) -> None:
    tag = uuid.uuid4().hex[:8]
    ours, floors = f"g{tag}", f"f{tag}"
    mine, theirs = f"m-{tag}-guard", f"m-{tag}-floor"
    if stub:
        add_stubs(rel, [mine], ours)
        add_stubs(rel, [theirs], floors)
    handle = guarded(rel, ours)
    floor = WireFloor(postgres_url, floors, key_prefix, claim=not stub, redis_url=redis_url)
    try:
        handle.batch_each([Envelope(mine, "bench", 3, 41, b"{}")])
        floor([Envelope(theirs, "bench", 3, 41, b"{}")])
    finally:
        handle.handle.close()  # flushes the guard's queued done marker
        floor.close()  # writes the floor's last one
    guard_rows, floor_rows = written(rel, ours, mine), written(rel, floors, theirs)
    assert guard_rows["log"] == [("bench", 3, 41, 0, "SUCCESS", "processed", "bench", "")]
    assert guard_rows["inbox"][0][0] == "CONFIRMED"
    assert floor_rows == guard_rows
    client = redis_lib.Redis.from_url(redis_url)
    try:
        assert client.get(lease_key(key_prefix, ours, mine)) == client.get(
            lease_key(key_prefix, floors, theirs)
        )
        assert client.get(lease_key(key_prefix, floors, theirs)) == f"done:{PAYLOAD_HASH[:16]}".encode()
    finally:
        client.delete(lease_key(key_prefix, ours, mine), lease_key(key_prefix, floors, theirs))
        client.close()
