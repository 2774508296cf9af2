"""What the one-commit new-message path (issue 18) must still guarantee, on every backend.

The journal row, the watermark, the inbox row, the handler's writes, the confirmation and the outcome now
commit together; the ``done`` marker is not waited for. So: a worker dying mid-handler must leave nothing and
the sweeper must not take the message for lost; a failed handler must still leave its journal row and attempt
count; a ``done`` marker that never reached Redis must cost only a database check; and ``SET NX GET`` must
tell taken / done / held apart in one round trip.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import uuid
from typing import Any

import redis as redis_lib
from prometheus_client import CollectorRegistry
from sqlalchemy import text

from reliable import ConsumeResult, Envelope, Reason, idempotent_consumer
from reliable.models import utcnow
from reliable.stores import LeaseState
from reliable.stores.lease import RedisLeaseStore, done_value, lease_key
from reliable.sweeper import Sweeper
from reliable.types import StubStatus
from tests.core.guard_helpers import (
    add_stub,
    applied,
    apply,
    child_die_in_handler,
    env,
    inbox_attempts,
    log_rows,
    make_rel,
    stub_status,
)
from tests.services import PrivateRedis
from tests.sweeper.helpers import Clock, QueueSender
from tests.waiting import wait_until


def uid(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def at(message_id: str, offset: int) -> Envelope:
    return Envelope(message_id, "orders", 0, offset, b"{}")


def watermark(rel: Any, group: str = "g") -> int | None:
    with rel.engine.connect() as conn:
        v = conn.execute(
            text("SELECT max_offset FROM consume_progress WHERE consumer_group = :g AND topic = 'orders'"),
            {"g": group},
        ).scalar()
    return None if v is None else int(v)


def test_crash_mid_handler_leaves_nothing_the_sweeper_waits_and_the_redelivery_applies_once(
    db_url: str, redis_url: str, key_prefix: str
) -> None:
    """``os._exit`` inside the handler: no effect, no journal row, no watermark advance, no attempt. The
    sweeper sees a sent copy above the group's watermark that the broker still has — queued, not lost — and
    the broker's redelivery (once the dead worker's lease lapses) applies the message exactly once."""
    lease_ms = 120_000
    rel = make_rel(db_url, redis_url, key_prefix, lease_ms=lease_ms)
    with rel.engine.begin() as conn:  # start from an empty watermark for this group
        conn.execute(text("DELETE FROM consume_progress WHERE consumer_group = 'g'"))
    handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(apply)
    before, m = uid("ok"), uid("crash")
    add_stub(rel, m, "g")
    with rel.engine.begin() as conn:  # the producer's send landed at offset 501 of queue 0
        conn.execute(
            text(
                "UPDATE message_stub SET queue_id = 0, queue_offset = 501, send_count = 1 "
                "WHERE message_id = :m"
            ),
            {"m": m},
        )
    try:
        assert handle.decide(at(before, 500)).reason is Reason.PROCESSED  # the queue's previous message
        ctx = multiprocessing.get_context("spawn")
        p = ctx.Process(target=child_die_in_handler, args=(db_url, redis_url, key_prefix, m, lease_ms, 501))
        p.start()
        p.join(120)
        assert p.exitcode == 3
        assert applied(rel, m) == 0 and log_rows(rel, m) == []
        assert watermark(rel) == 500 and inbox_attempts(rel, "g", m) == 0
        assert stub_status(rel, m) is StubStatus.PENDING

        class Broker:  # the broker still has offsets up to 510 of the queue
            def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
                return 511

        sender = QueueSender()
        later = Clock(utcnow() + dt.timedelta(hours=1))  # long past the row's resend time
        summary = Sweeper(rel, sender, probe=Broker(), clock=later, stuck_after_s=24 * 3600).run_once()
        assert summary.resent == 0 and sender.ids() == []  # queued behind the watermark: not lost

        assert rel.redis is not None
        rel.redis.pexpire(lease_key(rel.settings.key_prefix, "g", m), 1)  # the dead worker's lease lapses
        wait_until(lambda: rel.redis is not None and not rel.redis.exists(lease_key(key_prefix, "g", m)))
        d = handle.decide(at(m, 501))
        assert (d.result, d.reason) == (ConsumeResult.SUCCESS, Reason.PROCESSED)
        assert applied(rel, m) == 1 and [r[1] for r in log_rows(rel, m)] == ["SUCCESS"]
        assert stub_status(rel, m) is StubStatus.CONFIRMED and watermark(rel) == 501
        assert handle.decide(at(m, 502)).duplicate and applied(rel, m) == 1
    finally:
        handle.guard.close()
        rel.close()


def test_failed_handler_keeps_its_journal_row_attempts_and_watermark(
    db_url: str, redis_url: str, key_prefix: str
) -> None:
    """The work transaction that carried the journal row rolled back; the failure transaction writes it again
    (outcome RETRY, reason handler_failed) beside attempts + 1 and the watermark, and frees the lease."""
    rel = make_rel(db_url, redis_url, key_prefix)

    def failing(e: Envelope, session: Any) -> None:
        apply(e, session)
        raise RuntimeError("downstream said no")

    handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(failing)
    m = uid("f")
    add_stub(rel, m, "g")
    try:
        d = handle.decide(at(m, 900))
        assert (d.result, d.reason, d.attempts) == (ConsumeResult.RECONSUME_LATER, Reason.HANDLER_FAILED, 1)
        assert d.log_id is not None
        rows = log_rows(rel, m)
        assert [(r[1], (r[2] or "").split(":")[0]) for r in rows] == [("RETRY", "handler_failed")]
        assert applied(rel, m) == 0 and inbox_attempts(rel, "g", m) == 1
        assert watermark(rel) is not None and watermark(rel) >= 900  # type: ignore[operator]
        assert rel.redis is not None and not rel.redis.exists(lease_key(key_prefix, "g", m))
    finally:
        handle.guard.close()
        rel.close()


def test_a_lost_done_marker_costs_only_a_database_check(db_url: str, redis_url: str, key_prefix: str) -> None:
    """The marker is queued, not waited for. Never sent (dropped from the queue: the key keeps our lease) or
    gone (the key expired): the duplicate is still answered — by the group's inbox row — and applied once."""
    rel = make_rel(db_url, redis_url, key_prefix)
    handle = idempotent_consumer(rel, group="g", registry=CollectorRegistry())(apply)
    lease = handle.guard.lease
    assert isinstance(lease, RedisLeaseStore)
    kept, gone = uid("kept"), uid("gone")
    try:
        for m in (kept, gone):
            assert handle.decide(env(m)).reason is Reason.PROCESSED
            dropped = lease._take_marks()  # lost: this marker never reaches Redis
            assert [k for k, _, _ in dropped] == [lease_key(key_prefix, "g", m)]
        assert rel.redis is not None
        rel.redis.delete(lease_key(key_prefix, "g", gone))
        held = handle.decide(env(kept))  # key still holds our processing lease: the inbox row answers
        assert (held.result, held.reason) == (ConsumeResult.SUCCESS, Reason.DUPLICATE_CONFIRMED)
        fresh = handle.decide(env(gone))  # key gone: the work transaction finds the confirmed row
        assert (fresh.result, fresh.reason) == (ConsumeResult.SUCCESS, Reason.DUPLICATE_CONFIRMED)
        assert applied(rel, kept) == 1 and applied(rel, gone) == 1
        lease.flush()  # the marker of the second answer replaces the lease again
        assert str(rel.redis.get(lease_key(key_prefix, "g", gone))).startswith("b'done")
    finally:
        handle.guard.close()
        rel.close()


class _CountingConnection(redis_lib.Connection):
    sends = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sends += 1  # one packed send: one command or one whole pipeline
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


def test_set_nx_get_tells_taken_done_held_in_one_round_trip_and_marks_ride_along(
    private_redis: PrivateRedis,
) -> None:
    client = redis_lib.Redis(
        connection_pool=redis_lib.ConnectionPool(
            host="127.0.0.1", port=private_redis.port, connection_class=_CountingConnection
        )
    )
    store = RedisLeaseStore(client, done_flush_ms=60_000)  # the timer will not fire during this test
    try:
        client.ping()  # connect first: the handshake (HELLO, CLIENT SETINFO) is not the guard's
        _CountingConnection.sends = 0
        taken = store.acquire_many(["k1"], ["processing:a"], 60_000)
        held = store.acquire_many(["k1"], ["processing:b"], 60_000)
        assert [taken[0].state, held[0].state] == [LeaseState.ACQUIRED, LeaseState.HELD]
        assert _CountingConnection.sends == 2  # one round trip each
        store.mark_done_many([("k1", done_value("ab" * 32))], 60)
        assert _CountingConnection.sends == 2  # queued, not sent
        assert client.get("k1") == b"processing:a"  # (this read is the third send)
        both = store.acquire_many(["k1", "k2"], ["processing:c", "processing:d"], 60_000)
        assert _CountingConnection.sends == 4  # the marker rode in the acquire's pipeline, ahead of it
        assert [(a.state, a.done_hash) for a in both] == [
            (LeaseState.DONE, "ab" * 8),
            (LeaseState.ACQUIRED, None),
        ]
        assert client.ttl("k1") > 0 and client.get("k2") == b"processing:d"
        store.mark_done_many([("k2", done_value(None))], 60)
        store.close()  # close sends what is still queued
        assert client.get("k2") == b"done"
    finally:
        store.close()
        client.close()
