"""Two sweepers at once on PostgreSQL and MariaDB: SKIP LOCKED claims, never a double send."""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import pytest
from sqlalchemy import Connection, text

from reliable import Reliability
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.sweeper import FixedBackoff, Sweeper
from reliable.sweeper.claim import LockMode, claim, lock_mode
from reliable.sweeper.giveup import raise_never_consumed
from reliable.sweeper.selection import Candidate, due_statement
from reliable.sweeper.verdict import Facts
from tests.sweeper.helpers import T0, Clock, QueueSender, add_log, add_stub, candidate, clean, set_progress
from tests.waiting import LOCK_WAITS, wait_until

N = 300


@pytest.fixture
def rels(server_url: str) -> Iterator[tuple[Reliability, Reliability]]:
    a = Reliability(server_url, redis_url="", max_sends=5)
    b = Reliability(server_url, redis_url="", max_sends=5)
    clean(a.engine)
    yield a, b
    a.close()
    b.close()


def short_lock_wait(conn: Connection) -> None:
    """Fail in 2 s instead of hanging if the statement under test does wait for a lock."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SET LOCAL lock_timeout = '2s'"))
    else:
        conn.execute(text("SET SESSION innodb_lock_wait_timeout = 2"))


def test_server_supports_skip_locked(rels: tuple[Reliability, Reliability]) -> None:
    with rels[0].engine.connect() as conn:
        assert lock_mode(conn) is LockMode.SKIP_LOCKED


@pytest.mark.parametrize("claim_ttl", [None, 30.0], ids=["default-window", "30s-window"])
def test_two_sweepers_racing_never_double_send(
    rels: tuple[Reliability, Reliability], claim_ttl: float | None
) -> None:
    a, b = rels
    for i in range(N):
        add_stub(a, f"m{i:04d}", resend_at=T0 - dt.timedelta(seconds=N - i))
    sender = QueueSender()  # shared: a double send shows up as a repeated id
    barrier = threading.Barrier(2)
    summaries = []
    errors: list[BaseException] = []

    def run(rel: Reliability) -> None:
        sweeper = Sweeper(
            rel, sender, backoff=FixedBackoff((60.0,)), batch=7, clock=Clock(), claim_ttl_s=claim_ttl
        )
        try:
            barrier.wait(timeout=10)
            summaries.append(sweeper.run_once())
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    counts = Counter(sender.ids())
    assert [m for m, c in counts.items() if c > 1] == []
    assert len(counts) == N
    assert sum(s.resent for s in summaries) == N
    assert all(s.resent > 0 for s in summaries), "both sweepers should have taken a share"


def test_skip_locked_claim_skips_rows_another_claim_holds(rels: tuple[Reliability, Reliability]) -> None:
    a, b = rels
    for i in range(10):
        add_stub(a, f"m{i}", resend_at=T0 - dt.timedelta(seconds=10 - i))
    stmt = due_statement(
        now=T0, stuck_after=dt.timedelta(minutes=10), max_sends=5, limit=4, dialect=a.engine.dialect.name
    )
    with a.engine.connect() as first:
        tx = first.begin()
        held = claim(first, stmt, until=None)  # rows locked, transaction still open
        with b.engine.connect() as second, second.begin():
            short_lock_wait(second)
            other = claim(second, stmt, until=None)  # would block (then time out) without SKIP LOCKED
        tx.rollback()
    assert [c.message_id for c in held] == ["m0", "m1", "m2", "m3"]
    assert [c.message_id for c in other] == ["m4", "m5", "m6", "m7"]


def test_claim_does_not_block_consumer_journal_writes(rels: tuple[Reliability, Reliability]) -> None:
    """The selection reads consume_progress, message_log (subqueries, or a LATERAL join on PostgreSQL) and
    message_stub (joined where the lock clause names message_inbox): only the inbox rows may be locked."""
    a, b = rels
    add_stub(a, "m0", queue_offset=1)
    add_log(a, "m0", T0 - dt.timedelta(hours=1))  # received, never confirmed: stuck
    set_progress(a, 5)
    stmt = due_statement(
        now=T0, stuck_after=dt.timedelta(minutes=10), max_sends=5, limit=4, dialect=a.engine.dialect.name
    )
    with a.engine.connect() as first:
        tx = first.begin()
        assert [c.message_id for c in claim(first, stmt, until=None)] == ["m0"]
        with b.engine.connect() as second, second.begin():
            short_lock_wait(second)
            second.execute(text("UPDATE consume_progress SET max_offset = 6"))
            second.execute(text("UPDATE message_log SET reconsume_times = 1 WHERE message_id = 'm0'"))
            second.execute(text("UPDATE message_stub SET tags = 'x' WHERE message_id = 'm0'"))
        tx.rollback()


class _SlowSender(QueueSender):
    """Each send takes ``seconds`` of the sweepers' (shared, manual) clock."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        super().__init__()
        self.clock, self.seconds = clock, seconds

    def send(self, message: OutgoingMessage) -> SendReceipt:
        self.clock.advance(self.seconds)
        return super().send(message)


def test_a_lease_claimed_batch_starts_no_send_its_claim_will_not_cover(
    rels: tuple[Reliability, Reliability],
) -> None:
    """Claims last 10 s and each send takes 3 s: the fourth send would start after the claim's last fifth,
    when a second sweeper may take the same rows — both sent them and both were recorded, spending the
    budget twice as fast. Now the first sweeper leaves the rest claimed; once the claim ends, the second
    takes them. Every row is sent exactly once."""
    rel, other = rels
    for i in range(10):
        add_stub(rel, f"slow-{i}", resend_at=T0 - dt.timedelta(seconds=1))
    clock = Clock(T0)
    sender = _SlowSender(clock, 3.0)
    first, second = (
        Sweeper(r, sender, backoff=FixedBackoff((3600.0,)), clock=clock, claim_ttl_s=10, batch=10)
        for r in (rel, other)
    )
    assert first.run_once().resent == 3  # sends at 0, 3 and 6 s; the claim's last fifth starts at 8 s
    clock.advance(1.5)  # the claim has ended
    while second.run_once().resent:
        clock.advance(10.5)
    assert sorted(Counter(m.message_id for m in sender.sent).values()) == [1] * 10


def test_two_sweepers_raising_one_never_consumed_alarm_at_once_raise_it_once(
    rels: tuple[Reliability, Reliability],
) -> None:
    """Two sweepers' claims hold different waiting rows of one never-consumed queue in transactions open at
    the same time: the second waits for the first's alarm and then stands down (it raised a second one)."""
    a, b = rels
    for mid in ("w0", "w1"):
        add_stub(a, mid, queue_offset=int(mid[1]))
    facts = Facts(watermark=None, broker_max=10)

    def waiting(mid: str) -> tuple[Candidate, str, Facts]:
        return replace(_WAITING, message_id=mid), "orders", facts

    raised: list[int] = []
    with a.engine.connect() as first:
        tx = first.begin()
        assert raise_never_consumed(first, [waiting("w0")], now=T0) == 1

        def second_sweeper() -> None:
            with b.engine.begin() as second:
                raised.append(raise_never_consumed(second, [waiting("w1")], now=T0))

        other = threading.Thread(target=second_sweeper)
        other.start()
        # it waits for the first transaction's marker row (without the marker it went on and raised its own)
        wait_until(lambda: not other.is_alive() or _insert_waits(a), what="the second sweeper to wait or end")
        tx.commit()
    other.join(30)
    assert not other.is_alive()
    assert raised == [0]
    with a.engine.connect() as conn:
        told = conn.execute(text("SELECT message_id, reason FROM stub_notification")).all()
    assert len(told) == 1 and told[0][0].startswith("~never:") and "e.g. w0" in told[0][1]  # one alarm


def _insert_waits(rel: Reliability) -> bool:
    query = {
        "postgresql": LOCK_WAITS["postgresql"],
        "mysql": (
            "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() "
            "AND info LIKE 'INSERT INTO stub_no%'"
        ),
    }[rel.engine.dialect.name]
    with rel.engine.connect() as conn:
        return bool(conn.execute(text(query)).scalar())


_WAITING = candidate(message_id="w", stub_queue_id=0, stub_queue_offset=0)
