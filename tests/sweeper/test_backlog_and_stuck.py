"""Backlog estimate (queued messages are not re-sent) and stuck recovery against a real Redis."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
import redis as redis_lib

from reliable import Reliability
from reliable import constants as C
from reliable.stores import LeaseState
from reliable.stores.lease import lease_key
from reliable.sweeper import BacklogEstimator, FixedBackoff, Sweeper
from reliable.sweeper.backoff import QueueProgress
from reliable.sweeper.leases import RoundLeases
from reliable.sweeper.notices import NoticeKind
from reliable.types import LogOutcome, StubStatus
from tests.sweeper.helpers import (
    T0,
    Clock,
    MemoryChannel,
    QueueSender,
    add_log,
    add_stub,
    clean,
    get_inbox,
    set_inbox,
    set_progress,
)

BACKOFF = FixedBackoff((10.0,))
#: the lease the tests' killed worker left: 45 s
LEASE_END = dt.timedelta(seconds=45)


class StaticBacklog:
    """A BrokerProbe as a broker adapter provides it: the queue's next offset (the broker is not the
    subject here; tests/sweeper/test_probe_broker_sim.py asks a real one)."""

    def __init__(self, next_offsets: dict[tuple[str, int], int]) -> None:
        self.next_offsets = next_offsets
        self.calls: list[tuple[str, int]] = []

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        self.calls.append((topic, queue_id))
        return self.next_offsets.get((topic, queue_id))


# --- the estimator on its own ----------------------------------------------------------------------------
def progress(max_offset: int, min_offset: int, seconds: float) -> QueueProgress:
    return QueueProgress(
        max_offset, min_offset, T0 - dt.timedelta(seconds=seconds), T0, max_offset - min_offset
    )


def test_estimate_is_lag_over_observed_rate() -> None:
    est = BacklogEstimator()
    # the group advanced 1000 offsets in 100 s (10/s) and is at 1000; our copy landed at 1500
    assert est.estimate(progress(1000, 0, 100), "t", 0, 1500) == dt.timedelta(seconds=50)


def test_estimate_prefers_the_broker_max_offset_when_a_source_answers() -> None:
    source = StaticBacklog({("t", 0): 2001})
    est = BacklogEstimator(source)
    assert est.estimate(progress(1000, 0, 100), "t", 0, 1500) == dt.timedelta(seconds=100)
    assert est.estimate(progress(1000, 0, 100), "t", 1, 1500) == dt.timedelta(seconds=50)  # None: fallback


def test_estimate_is_zero_without_rate_and_capped() -> None:
    est = BacklogEstimator(cap_s=30)
    assert est.estimate(None, "t", 0, 1500) == dt.timedelta(0)
    assert est.estimate(progress(5, 5, 100), "t", 0, 1500) == dt.timedelta(0)  # no movement: no rate
    assert est.estimate(progress(1000, 0, 0), "t", 0, 1500) == dt.timedelta(0)
    assert est.estimate(progress(1000, 0, 100), "t", 0, 900) == dt.timedelta(0)  # already passed
    assert est.estimate(progress(1000, 0, 100), "t", 0, 10**9) == dt.timedelta(seconds=30)


# --- in a round -------------------------------------------------------------------------------------------
def test_resend_at_includes_backlog_and_queued_copy_is_not_resent(rel: Reliability, clock: Clock) -> None:
    sender = QueueSender(queues=1, start=2000)  # the resend lands at offset 2000 of queue 0
    add_stub(rel, "lost", queue_offset=900)
    # consumer at 1000, advancing 10 offsets/s: 1000 messages ahead of the copy → 100 s of backlog
    set_progress(rel, 1000, min_offset=0, created_at=T0 - dt.timedelta(seconds=100), updated_at=T0)
    sweeper = Sweeper(rel, sender, backoff=BACKOFF, clock=clock)
    assert sweeper.run_once().resent == 1
    row = get_inbox(rel, "lost")
    assert (row.queue_id, row.queue_offset) == (0, 2000)
    assert row.resend_at == T0 + dt.timedelta(seconds=10 + 100)
    # backoff alone has passed, the backlog has not: nothing is re-sent
    clock.advance(50)
    assert sweeper.run_once().resent == 0
    # even past resend_at, a copy above the watermark is waiting in the queue, not lost
    clock.advance(200)
    set_progress(rel, 1999, min_offset=0, created_at=T0 - dt.timedelta(seconds=100), updated_at=clock.now)
    assert sweeper.run_once().resent == 0
    assert sender.ids() == ["lost"]
    # the consumer passed it without a log row: lost again, found when the queued row is looked at next
    set_progress(rel, 2001, min_offset=0, created_at=T0 - dt.timedelta(seconds=100), updated_at=clock.now)
    clock.advance(60)
    assert sweeper.run_once().resent == 1


def test_probe_sizes_the_backlog_estimate(rel: Reliability, sender: QueueSender, clock: Clock) -> None:
    source = StaticBacklog({("orders", 0): 5001})
    sender = QueueSender(queues=1, start=1500)
    add_stub(rel, "lost", queue_offset=None)
    set_progress(rel, 1000, min_offset=0, created_at=T0 - dt.timedelta(seconds=100), updated_at=T0)
    Sweeper(rel, sender, backoff=BACKOFF, probe=source, clock=clock).run_once()
    assert source.calls == [("orders", 0)]
    assert get_inbox(rel, "lost").resend_at == T0 + dt.timedelta(seconds=10 + 400)


class RefusingProbe:
    """A probe whose broker refuses the offset query (the contract says ``None``; a raising one is "cannot
    tell" too)."""

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        raise ConnectionError("broker refused the offset query")


def test_a_probe_failing_for_the_backlog_estimate_does_not_lose_the_sends_record(
    rel: Reliability, clock: Clock
) -> None:
    """The estimate asked the probe inside the record transaction, uncaught: the round raised after the
    send, which was never recorded (and was sent again once the claim ended)."""
    sender = QueueSender(queues=1, start=1500)
    add_stub(rel, "lost", queue_offset=None)
    set_progress(rel, 1000, min_offset=0, created_at=T0 - dt.timedelta(seconds=100), updated_at=T0)
    summary = Sweeper(rel, sender, backoff=BACKOFF, probe=RefusingProbe(), clock=clock).run_once()
    row = get_inbox(rel, "lost")
    assert (summary.resent, row.resend_count, row.queue_offset) == (1, 1, 1500)
    assert row.resend_at == T0 + dt.timedelta(seconds=10 + 50)  # the receipt's end: 500 offsets at 10/s


# --- stuck recovery with the Redis lease ------------------------------------------------------------------
@pytest.fixture
def redis_rel(db_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    r = Reliability(db_url, redis_url=redis_url, key_prefix=key_prefix, max_sends=3, stuck_after_s=600)
    clean(r.engine)
    yield r
    assert r.redis is not None
    for key in r.redis.scan_iter(f"{key_prefix}:*"):
        r.redis.delete(key)
    r.close()


def stuck_stub(rel: Reliability, name: str) -> None:
    add_stub(rel, name, queue_offset=4)
    set_progress(rel, 4)
    add_log(rel, name, T0 - dt.timedelta(hours=1), queue_offset=4)


def test_stuck_with_live_lease_is_left_alone_then_recovered_when_it_expires(
    redis_rel: Reliability, sender: QueueSender, clock: Clock, key_prefix: str
) -> None:
    stuck_stub(redis_rel, "held")
    assert redis_rel.redis is not None
    key = lease_key(key_prefix, "billing", "held")
    redis_rel.redis.set(key, C.LEASE_PROCESSING_PREFIX + "worker-7", px=45_000)
    sweeper = Sweeper(redis_rel, sender, backoff=BACKOFF, clock=clock)
    summary = sweeper.run_once()
    assert (summary.resent, summary.lease_held) == (0, 1)
    row = get_inbox(redis_rel, "held")
    # postponed by the lease's time left, so it does not take batch slots every round
    assert row.resend_at is not None
    assert T0 + dt.timedelta(seconds=40) < row.resend_at <= T0 + dt.timedelta(seconds=45)
    redis_rel.redis.delete(key)  # the worker died; its lease expired
    clock.advance(45)
    summary = sweeper.run_once()
    assert (summary.resent, summary.stuck_recovered) == (1, 1)
    assert sender.ids() == ["held"]


def test_stuck_without_lease_or_with_done_marker_is_resent(
    redis_rel: Reliability, sender: QueueSender, clock: Clock, key_prefix: str
) -> None:
    stuck_stub(redis_rel, "free")
    stuck_stub(redis_rel, "done")
    assert redis_rel.redis is not None
    redis_rel.redis.set(lease_key(key_prefix, "billing", "done"), C.LEASE_DONE_VALUE, ex=600)
    summary = Sweeper(redis_rel, sender, backoff=BACKOFF, clock=clock).run_once()
    assert (summary.resent, summary.stuck_recovered, summary.lease_held) == (2, 2, 0)


def test_stuck_at_budget_with_live_lease_is_not_given_up(
    redis_rel: Reliability, sender: QueueSender, clock: Clock, key_prefix: str
) -> None:
    add_stub(redis_rel, "busy", send_count=3)
    add_log(redis_rel, "busy", T0 - dt.timedelta(hours=1))
    assert redis_rel.redis is not None
    redis_rel.redis.set(lease_key(key_prefix, "billing", "busy"), "processing:w1", px=30_000)
    summary = Sweeper(redis_rel, sender, backoff=BACKOFF, clock=clock).run_once()
    assert (summary.dead, summary.lease_held) == (0, 1)
    assert get_inbox(redis_rel, "busy").status is StubStatus.PENDING


def test_a_never_received_row_waits_for_a_held_lease_but_not_past_the_last_resort_age(
    redis_rel: Reliability, sender: QueueSender, clock: Clock, key_prefix: str
) -> None:
    """A worker killed in the handler journals nothing: its row looks never received, and was re-sent (here
    ``OVERTAKEN``: the group consumed past it) beside the copy its lease says is still in flight. Now held
    until the lease ends. A lease that never ends (a key without a TTL) holds it only until the copy is
    ``max_unconfirmed_age + stuck_after`` old: then it is re-sent, or at the budget given up and told."""
    add_stub(redis_rel, "in-flight", queue_offset=4)  # sent an hour before T0
    add_stub(redis_rel, "spent", queue_offset=5, send_count=3)
    set_progress(redis_rel, 9)
    assert redis_rel.redis is not None
    keys = [lease_key(key_prefix, "billing", mid) for mid in ("in-flight", "spent")]
    for key in keys:
        redis_rel.redis.set(key, C.LEASE_PROCESSING_PREFIX + "killed-worker", px=45_000)
    channel = MemoryChannel()
    sweeper = Sweeper(
        redis_rel, sender, backoff=BACKOFF, clock=clock, max_unconfirmed_age_s=7200, channels=[channel]
    )
    summary = sweeper.run_once()
    assert (summary.resent, summary.dead, summary.lease_held) == (0, 0, 2), summary.line()
    row = get_inbox(redis_rel, "in-flight")
    assert row.resend_at is not None and T0 + dt.timedelta(seconds=40) < row.resend_at <= T0 + LEASE_END
    for key in keys:  # held for ever from now on
        redis_rel.redis.persist(key)
    clock.advance(LEASE_END.total_seconds())
    summary = sweeper.run_once()
    assert (summary.resent, summary.dead, summary.lease_held) == (0, 0, 2), summary.line()
    assert get_inbox(redis_rel, "in-flight").resend_at == clock.now + dt.timedelta(seconds=600)
    clock.now = T0 + dt.timedelta(hours=1, seconds=600)  # sent 2 h (max_unconfirmed_age) + stuck_after ago
    summary = sweeper.run_once()
    assert (summary.resent, summary.dead, summary.lease_held) == (1, 1, 0), summary.line()
    assert sender.ids() == ["in-flight"]
    assert get_inbox(redis_rel, "spent").status is StubStatus.DEAD
    assert [n.message_id for n in channel.notices if n.kind is NoticeKind.DEAD] == ["spent"]


def test_a_stuck_row_held_by_a_lease_without_expiry_is_resent_or_given_up_past_the_last_resort_age(
    redis_rel: Reliability, sender: QueueSender, clock: Clock, key_prefix: str
) -> None:
    """A received row whose ``processing:`` key has no TTL (a Redis restored from a snapshot, a PERSIST) was
    held ``stuck_after`` at a time for ever: PENDING, seen only in the ``lease_held`` count, nobody told.
    Now held only until the message is ``max_unconfirmed_age + stuck_after`` old, then re-sent, or at the
    budget given up and told. A stuck row whose lease expires normally is held as before, however old."""
    for name, sends in (("endless", 1), ("spent", 3), ("live", 1)):
        add_stub(redis_rel, name, queue_offset=4, send_count=sends)  # staged an hour before T0
        add_log(redis_rel, name, T0 - dt.timedelta(hours=1), queue_offset=4)
    set_progress(redis_rel, 4)
    assert redis_rel.redis is not None
    for name in ("endless", "spent"):
        redis_rel.redis.set(lease_key(key_prefix, "billing", name), C.LEASE_PROCESSING_PREFIX + "restored")
    live = lease_key(key_prefix, "billing", "live")
    channel = MemoryChannel()
    sweeper = Sweeper(
        redis_rel, sender, backoff=BACKOFF, clock=clock, max_unconfirmed_age_s=7200, channels=[channel]
    )
    for now in (T0, T0 + dt.timedelta(hours=1)):  # the message 1 h, then 2 h old: below 2 h + stuck_after
        clock.now = now
        redis_rel.redis.set(live, C.LEASE_PROCESSING_PREFIX + "worker-7", px=45_000)
        summary = sweeper.run_once()
        assert (summary.resent, summary.dead, summary.lease_held) == (0, 0, 3), summary.line()
        assert get_inbox(redis_rel, "endless").resend_at == now + dt.timedelta(seconds=600)
    clock.now = T0 + dt.timedelta(hours=1, seconds=600)  # staged 2 h (max_unconfirmed_age) + stuck_after ago
    redis_rel.redis.set(live, C.LEASE_PROCESSING_PREFIX + "worker-8", px=45_000)  # a worker on it, as ever
    summary = sweeper.run_once()
    assert (summary.resent, summary.dead, summary.lease_held) == (1, 1, 1), summary.line()
    assert sender.ids() == ["endless"]
    assert get_inbox(redis_rel, "spent").status is StubStatus.DEAD
    (notice,) = [n for n in channel.notices if n.kind is NoticeKind.DEAD]
    assert notice.message_id == "spent" and "without a TTL" in notice.reason, notice.reason
    assert "delete the key, then revive" in notice.reason
    assert get_inbox(redis_rel, "live").status is StubStatus.PENDING


def test_unreachable_redis_postpones_stuck_stubs(
    rel: Reliability, sender: QueueSender, clock: Clock, private_redis: object
) -> None:
    from tests.services import PrivateRedis

    assert isinstance(private_redis, PrivateRedis)
    client = redis_lib.Redis.from_url(private_redis.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    private_redis.stop()
    views = RoundLeases(client, "p", dt.timedelta(seconds=1)).read([("g", "m")])
    assert [v.state for v in views] == [LeaseState.UNAVAILABLE]
    rel.redis = client
    stuck_stub(rel, "unknown")
    add_stub(rel, "never-logged", queue_offset=None)
    summary = Sweeper(rel, sender, backoff=BACKOFF, clock=clock).run_once()
    assert (summary.resent, summary.lease_unknown) == (1, 1)
    assert sender.ids() == ["never-logged"]
    assert get_inbox(rel, "unknown").resend_at == T0 + dt.timedelta(milliseconds=rel.settings.lease_ms)
    rel.redis = None


# --- stuck detection leaves the guard's and the broker's decisions alone ---------------------------------
def test_stuck_skips_what_the_guard_gave_up_on_but_not_a_stray_body(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    """The guard sets a row DEAD when its handler failed ``max_attempts`` times (a person is told, nothing is
    re-sent); a delivery dead-lettered for another body under the staged id leaves the row stuck."""
    for name, reason in [("poison", "max_attempts: 16 handler failures"), ("tampered", "payload_mismatch")]:
        stuck_stub(rel, name)
        add_log(rel, name, T0 - dt.timedelta(minutes=50), outcome=LogOutcome.DEAD_LETTER, reason=reason)
    set_inbox(rel, "poison", status=StubStatus.DEAD, last_error="DEAD: max_attempts: 16 handler failures")
    stuck_stub(rel, "plain")
    summary = Sweeper(rel, sender, backoff=BACKOFF, clock=clock).run_once()
    assert (summary.selected, summary.resent, summary.stuck_recovered) == (2, 2, 2)
    assert summary.dead_lettered == 1  # the poison row's notice
    assert sorted(sender.ids()) == ["plain", "tampered"]


def test_stuck_waits_for_the_brokers_own_retry(rel: Reliability, sender: QueueSender, clock: Clock) -> None:
    """The newest delivery answered RECONSUME_LATER at reconsume_times 15: RocketMQ redelivers after 2 h."""
    add_stub(rel, "retrying", queue_offset=4)
    set_progress(rel, 4)
    received = T0 - dt.timedelta(hours=1)
    add_log(rel, "retrying", received, reconsume_times=15, outcome=LogOutcome.RETRY)
    sweeper = Sweeper(rel, sender, backoff=BACKOFF, clock=clock)  # stuck_after 600 s
    summary = sweeper.run_once()
    assert (summary.resent, summary.held) == (0, 1)
    window_end = received + dt.timedelta(hours=2, seconds=600)
    assert get_inbox(rel, "retrying").resend_at == window_end  # looked at again when the window closes
    clock.now = window_end
    assert sweeper.run_once().stuck_recovered == 1
    assert sender.ids() == ["retrying"]
