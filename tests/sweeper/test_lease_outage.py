"""A sweeper round whose Redis is hung (SIGSTOP: connections are accepted, nothing answers) or gone.

The leases are read once a batch, after the claim commits (:mod:`reliable.sweeper.leases`). With Redis hung,
every batch of a round paid a socket timeout for its read — a round of 10 000 due rows (20 batches) took
13.6 s, now 3.6 s. Now a failed read makes the leases unknown for
``SWEEP_LEASE_RETRY_AFTER_S`` of the round (the sweeper's monotonic clock: a test moves it): the rows are
judged by the rules for "Redis cannot tell" (stuck rows held, rows never received re-sent as before), it is
logged once a round, and Redis is asked again after that interval and at the next round. A stuck row is held
through an outage only until its message is ``max_unconfirmed_age + stuck_after`` old; reads failing longer
than ``stuck_after`` are said in an ERROR a round and a gauge.

How many times Redis was asked is read from the server itself: each failed read leaves its connection
(redis-py drops a connection that timed out and opens another for the next call), and once the server runs
again it accepts every connection queued meanwhile at once, counting them in ``total_connections_received``.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis as redis_lib
from sqlalchemy.orm import Session

from reliable import Envelope, Reason, Reliability, idempotent_consumer
from reliable import constants as C
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.stores.lease import lease_key
from reliable.sweeper import FixedBackoff, NoticeKind, Sweeper
from reliable.types import StubStatus
from tests.services import PrivateRedis
from tests.sweeper.helpers import (
    T0,
    Clock,
    MemoryChannel,
    QueueSender,
    add_log,
    add_stub,
    clean,
    get_inbox,
    outage_errors,
    set_progress,
    unreadable_seconds,
)
from tests.waiting import wait_until

BACKOFF = FixedBackoff((10.0,))
#: the sweeper's socket timeout on Redis (the settings' default): what each read of a hung Redis costs
SOCKET_TIMEOUT_S = 0.5


class Monotonic:
    """The sweeper's monotonic clock, moved by the test (or by its sender) only."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class SlowSender(QueueSender):
    """Sends for real (in process) and moves the sweeper's monotonic clock by ``step_s`` a send: a round
    that takes time."""

    def __init__(self, mono: Monotonic, step_s: float) -> None:
        super().__init__()
        self.mono, self.step_s = mono, step_s

    def send(self, message: OutgoingMessage) -> SendReceipt:
        self.mono.t += self.step_s
        return super().send(message)


@pytest.fixture
def lease_rel(db_url: str, private_redis: PrivateRedis) -> Iterator[Reliability]:
    """A Reliability on the test's own Redis, no connection open yet (the round opens the first)."""
    client = redis_lib.Redis.from_url(
        private_redis.url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S
    )
    r = Reliability(db_url, redis=client, max_sends=3, stuck_after_s=600)
    clean(r.engine)
    yield r
    r.close()


@contextmanager
def hung(server: PrivateRedis) -> Iterator[None]:
    """The server stopped (SIGSTOP): the kernel still accepts connections, nothing answers."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def connections(admin: redis_lib.Redis) -> int:
    return int(admin.info("stats")["total_connections_received"])


def reads_while_hung(admin: redis_lib.Redis, before: int) -> int:
    """The connections the sweeper opened while the server was stopped (one per read that waited)."""
    return wait_until(lambda: connections(admin) - before, what="the server to accept the queued connections")


def stuck_stub(rel: Reliability, name: str) -> None:
    add_stub(rel, name, queue_offset=4)
    add_log(rel, name, T0 - dt.timedelta(hours=1), queue_offset=4)


def lease_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "Redis lease read failed" in r.getMessage()]


def test_a_hung_redis_costs_a_round_one_lease_read_not_one_a_batch(
    lease_rel: Reliability,
    private_redis: PrivateRedis,
    sender: QueueSender,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for i in range(3):
        stuck_stub(lease_rel, f"stuck-{i}")
        add_stub(lease_rel, f"new-{i}", queue_offset=None)
    set_progress(lease_rel, 4)
    sweeper = Sweeper(lease_rel, sender, backoff=BACKOFF, clock=clock, batch=2)  # 3 batches
    sweeper.monotonic = Monotonic()
    admin = redis_lib.Redis(port=private_redis.port, socket_timeout=10)
    before = connections(admin)
    caplog.set_level(logging.WARNING, logger="reliable.sweeper")
    with hung(private_redis):
        summary = sweeper.run_once()
    assert (summary.selected, summary.resent, summary.lease_unknown) == (6, 3, 3), summary.line()
    assert sorted(sender.ids()) == ["new-0", "new-1", "new-2"]  # Redis cannot tell: sent as before
    lease_end = T0 + dt.timedelta(milliseconds=lease_rel.settings.lease_ms)
    assert [get_inbox(lease_rel, f"stuck-{i}").resend_at for i in range(3)] == [lease_end] * 3
    assert reads_while_hung(admin, before) == 1
    assert len(lease_warnings(caplog)) == 1, lease_warnings(caplog)
    # the next round asks Redis again: a worker holds stuck-0, the others are recovered
    assert lease_rel.redis is not None
    held = lease_key(lease_rel.settings.key_prefix, "billing", "stuck-0")
    lease_rel.redis.set(held, C.LEASE_PROCESSING_PREFIX + "worker-7", px=30_000)
    clock.now = lease_end
    summary = sweeper.run_once()
    assert (summary.resent, summary.lease_held, summary.lease_unknown) == (2, 1, 0), summary.line()
    assert len(lease_warnings(caplog)) == 1


def test_a_long_round_asks_a_hung_redis_again_after_the_interval(
    lease_rel: Reliability, private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis back in the middle of a long round is used again: one read an interval, one warning a round."""
    for i in range(8):
        add_stub(lease_rel, f"new-{i}", queue_offset=None)
    mono = Monotonic()
    # each batch of 2 sends moves the clock by half the interval: batches 1 and 3 ask Redis, 2 and 4 do not
    sender = SlowSender(mono, C.SWEEP_LEASE_RETRY_AFTER_S / 4 + 1)
    sweeper = Sweeper(lease_rel, sender, backoff=BACKOFF, clock=Clock(), batch=2)
    sweeper.monotonic = mono
    admin = redis_lib.Redis(port=private_redis.port, socket_timeout=10)
    before = connections(admin)
    caplog.set_level(logging.WARNING, logger="reliable.sweeper")
    with hung(private_redis):
        summary = sweeper.run_once()
    assert summary.resent == 8, summary.line()
    assert reads_while_hung(admin, before) == 2
    assert len(lease_warnings(caplog)) == 1, lease_warnings(caplog)


def test_a_redis_outage_holds_a_stuck_row_only_until_the_last_resort_age_and_says_so(
    lease_rel: Reliability,
    private_redis: PrivateRedis,
    sender: QueueSender,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis down: nobody can tell whether a worker holds a stuck row's lease, and until 2026-11-29 the row
    was held for as long as the outage lasted — PENDING, counted ``lease_unknown``, nobody told. Now held
    only until the message is ``max_unconfirmed_age + stuck_after`` old, then re-sent, or at the budget
    given up with a notice; the guard, Redis still down, applies the copy once on the database alone. Reads
    failing for longer than ``stuck_after`` are said each round (an ERROR) and in a gauge."""
    for name, sends in (("stuck", 1), ("spent", 3)):
        add_stub(lease_rel, name, queue_offset=4, send_count=sends)  # staged an hour before T0
        add_log(lease_rel, name, T0 - dt.timedelta(hours=1), queue_offset=4)
    add_stub(lease_rel, "young", queue_offset=5, created_at=T0, last_sent_at=T0)
    add_log(lease_rel, "young", T0, queue_offset=5)  # stuck from T0 + stuck_after
    set_progress(lease_rel, 5)
    channel = MemoryChannel()
    sweeper = Sweeper(
        lease_rel, sender, backoff=BACKOFF, clock=clock, max_unconfirmed_age_s=7200, channels=[channel]
    )
    caplog.set_level(logging.WARNING, logger="reliable.sweeper")
    private_redis.stop()
    # the first two messages 1 h, then 2 h old: below max_unconfirmed_age (2 h) + stuck_after (600 s)
    for now, held, errors in ((T0, 2, 0), (T0 + dt.timedelta(hours=1), 3, 1)):
        clock.now = now
        summary = sweeper.run_once()
        assert (summary.resent, summary.dead, summary.lease_unknown) == (0, 0, held), summary.line()
        assert len(outage_errors(caplog)) == errors, outage_errors(caplog)
        assert unreadable_seconds() == (now - T0).total_seconds()
    assert "3 stuck row(s) held" in outage_errors(caplog)[0]
    clock.now = T0 + dt.timedelta(hours=1, seconds=600)  # staged max_unconfirmed_age + stuck_after ago
    summary = sweeper.run_once()
    assert (summary.resent, summary.dead, summary.lease_unknown) == (1, 1, 1), summary.line()
    assert sender.ids() == ["stuck"]
    assert get_inbox(lease_rel, "spent").status is StubStatus.DEAD
    (notice,) = [n for n in channel.notices if n.kind is NoticeKind.DEAD]
    assert notice.message_id == "spent" and "Redis could not be read" in notice.reason, notice.reason
    assert len(outage_errors(caplog)) == 2
    # the guard, Redis still down: the copy is applied once; the original, redelivered late, is a duplicate
    applied: list[str | None] = []

    def handler(env: Envelope, session: Session) -> None:
        applied.append(env.message_id)

    handle = idempotent_consumer(lease_rel, group="billing", redis_retry_after_s=0.0)(handler)
    (copy,), (receipt,) = sender.sent, sender.receipts
    resent = Envelope("stuck", copy.topic, receipt.queue_id, receipt.queue_offset, copy.body)
    assert handle.decide(resent).reason is Reason.PROCESSED
    original = Envelope("stuck", "orders", 0, 4, copy.body)
    assert handle.decide(original).reason is Reason.DUPLICATE_CONFIRMED
    assert applied == ["stuck"]
    assert get_inbox(lease_rel, "stuck").status is StubStatus.CONFIRMED
    # Redis back: the young row's lease is read (nobody holds it) and it is re-sent; the gauge falls to 0
    private_redis.start()
    clock.now += dt.timedelta(seconds=60)
    summary = sweeper.run_once()
    assert (summary.resent, summary.lease_unknown) == (1, 0), summary.line()
    assert sender.ids() == ["stuck", "young"]
    assert unreadable_seconds() == 0
    assert len(outage_errors(caplog)) == 2
