"""The sweeper holds no inbox row lock while it talks to the broker (claim → probe → send → record).

What users saw: a broker that answered slowly (each send waiting for its timeout) made consumers stall
exactly then — the sweeper held the batch's rows locked through its sends, and a consumer confirming one of
them (DESIGN.md §2 step 3 locks the group's inbox row) waited for the whole batch of broker calls, or its
delivery timed out. Now a short transaction claims the rows (moves their ``resend_at`` a claim window
ahead), the sends run with no transaction open, and a second short transaction records the outcomes —
conditionally: a confirmation that landed meanwhile stands. The same holds for the broker *probe* (its max
and min offsets, which decide lost/expired/queued/never consumed): it ran inside the claim transaction, so a
consumer confirming a claimed row waited for it (a hung broker group: a probe timeout a round).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import event, func, select

from reliable import GuardedHandler, Reason, Reliability, idempotent_consumer
from reliable import constants as C
from reliable.models import utcnow
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.sweeper import FixedBackoff, Sweeper
from reliable.sweeper.selection import notif
from reliable.sweeper.stall import StallResult, check_stalls
from reliable.types import StubStatus
from tests.core.guard_helpers import apply, env, ledger, ledger_md
from tests.sweeper.helpers import T0, Clock, QueueSender, add_stub, clean, get_inbox, set_progress
from tests.waiting import wait_until

#: how long a confirmation may take while the sweeper's send hangs (it took until the send was released)
CONFIRM_WITHIN_S = 5.0


class Hanging(Protocol):
    """A broker call that hangs: ``entered`` once it started, returns once the test sets ``release``."""

    entered: threading.Event
    release: threading.Event


class BlockedSender(QueueSender):
    """A broker whose sends hang until the test releases them (``fail``: then refuse them)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail = fail

    def send(self, message: OutgoingMessage) -> SendReceipt:
        self.entered.set()
        if not self.release.wait(30):
            raise TimeoutError("the test never released the send")
        if self.fail:
            raise ConnectionError("broker timed out")
        return super().send(message)


@pytest.fixture
def guarded(rel: Reliability) -> Iterator[GuardedHandler]:
    ledger_md.create_all(rel.engine)
    with rel.engine.begin() as conn:
        conn.execute(ledger.delete())
    yield idempotent_consumer(rel, group="billing", registry=CollectorRegistry())(
        lambda e, session: apply(e, session, note="billing")
    )


def owed_notices(rel: Reliability) -> int:
    with rel.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(notif)).scalar_one())


def sweep_in_background(sweeper: Sweeper) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            sweeper.run_once()
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def confirm_while_send_hangs(
    guarded: GuardedHandler, sender: Hanging, message_id: str
) -> tuple[Reason | None, float]:
    """Deliver ``message_id`` to the guard while the sweeper's send (or probe) hangs; what it decided, and
    how long it took (``None``: still waiting after CONFIRM_WITHIN_S)."""
    assert sender.entered.wait(10), "the sweeper never called the broker"
    outcome: list[Reason] = []
    consumer = threading.Thread(
        target=lambda: outcome.append(guarded.decide(env(message_id, f"body-{message_id}".encode())).reason),
        daemon=True,
    )
    started = dt.datetime.now(dt.UTC)
    consumer.start()
    consumer.join(CONFIRM_WITHIN_S)
    took = (dt.datetime.now(dt.UTC) - started).total_seconds()
    sender.release.set()
    consumer.join(30)
    return (outcome[0] if outcome and took < CONFIRM_WITHIN_S else None), took


@pytest.mark.parametrize("fail", [False, True], ids=["send-lands", "send-fails"])
def test_a_consumer_confirms_while_the_sweepers_send_hangs_and_its_confirmation_stands(
    rel: Reliability, guarded: GuardedHandler, clock: Clock, fail: bool
) -> None:
    add_stub(rel, "m", queue_offset=None, send_count=2)  # one resend so far; max_sends=3: one left
    sender = BlockedSender(fail=fail)
    sweeper = Sweeper(rel, sender, backoff=FixedBackoff((60.0,)), clock=clock)
    thread, errors = sweep_in_background(sweeper)
    reason, took = confirm_while_send_hangs(guarded, sender, "m")
    thread.join(30)
    assert not errors, errors
    assert reason is Reason.PROCESSED, f"the consumer waited {took:.1f} s for the sweeper's broker call"

    row = get_inbox(rel, "m")
    assert row.status is StubStatus.CONFIRMED
    assert row.last_error is None  # a confirmed row showing an error reads as a failure
    assert row.resend_count == 2  # the copy sent meanwhile is counted (the report explains its duplicate)
    assert (row.queue_offset is not None) is not fail  # where the landed copy is
    # the spent budget does not make the confirmed row DEAD, now or in a later round
    clock.advance(3600)
    assert sweeper.run_once().dead == 0
    assert get_inbox(rel, "m").status is StubStatus.CONFIRMED and owed_notices(rel) == 0


class BlockedProbe:
    """The broker's view of its queues (our ``BrokerProbe`` and ``RetentionProbe``) answering only once the
    test releases it: a broker group that hangs on the sweeper's offset query."""

    def __init__(self, max_offset: int, min_offset: int = 0) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.top, self.bottom = max_offset, min_offset

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        self.entered.set()
        if not self.release.wait(30):
            raise TimeoutError("the test never released the probe")
        return self.top

    def min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return self.bottom


#: what the probe's answer makes of the claimed row (its copy at offset 5 of orders queue 0): held as queued
#: (the broker has it beyond the group's watermark 3), given up (the broker lost it and the budget is spent),
#: or the never-consumed alarm (the group has no watermark there) — none of which may touch a row the group
#: confirmed while the probe was out
PROBE_CASES = {
    "queued": (10, 2, 3),
    "lost-and-spent": (5, 3, 3),
    "never-consumed": (10, 2, None),
}


@pytest.mark.parametrize("case", list(PROBE_CASES))
def test_a_consumer_confirms_while_the_sweepers_probe_hangs_and_its_confirmation_stands(
    rel: Reliability, guarded: GuardedHandler, clock: Clock, case: str
) -> None:
    broker_max, sends, watermark = PROBE_CASES[case]
    add_stub(rel, "m", queue_offset=5, send_count=sends)
    if watermark is not None:
        set_progress(rel, watermark)
    probe, sender = BlockedProbe(broker_max), QueueSender()
    sweeper = Sweeper(rel, sender, probe=probe, backoff=FixedBackoff((60.0,)), clock=clock)
    thread, errors = sweep_in_background(sweeper)
    reason, took = confirm_while_send_hangs(guarded, probe, "m")
    thread.join(30)
    assert not errors, errors
    assert reason is Reason.PROCESSED, f"the consumer waited {took:.1f} s for the sweeper's broker probe"

    row = get_inbox(rel, "m")
    assert (row.status, row.last_error, row.resend_count) == (StubStatus.CONFIRMED, None, sends - 1)
    assert sender.ids() == [] and owed_notices(rel) == 0  # no give-up notice, no never-consumed alarm
    clock.advance(3600)
    summary = sweeper.run_once()
    assert (summary.selected, summary.dead, summary.never_consumed) == (0, 0, 0)
    assert get_inbox(rel, "m").status is StubStatus.CONFIRMED and owed_notices(rel) == 0


def test_a_consumer_confirms_while_the_stall_checks_probe_hangs(
    rel: Reliability, guarded: GuardedHandler
) -> None:
    """The stalled-group check asks the broker too; on SQLite its transaction held the database's write lock
    through the probe, so every confirmation waited for it."""
    set_progress(rel, 3, updated_at=T0 - dt.timedelta(hours=1))  # still for an hour
    add_stub(rel, "owed", queue_offset=5)  # the group owes offset 5, beyond its watermark: a stall
    add_stub(rel, "m", queue_offset=None)
    probe = BlockedProbe(100)
    found: list[StallResult] = []
    after = dt.timedelta(minutes=5)
    check = threading.Thread(
        target=lambda: found.append(
            check_stalls(rel.engine, now=T0, stall_after=after, broker_max=probe.max_offset)
        ),
        daemon=True,
    )
    check.start()
    reason, took = confirm_while_send_hangs(guarded, probe, "m")
    check.join(30)
    assert reason is Reason.PROCESSED, f"the consumer waited {took:.1f} s for the stall check's probe"
    assert get_inbox(rel, "m").status is StubStatus.CONFIRMED
    assert [(r.open, r.raised) for r in found] == [(1, 1)]


def test_a_second_sweeper_neither_waits_for_nor_sends_what_the_first_is_sending(
    server_url: str, clock: Clock
) -> None:
    first, second = (Reliability(server_url, redis_url="", max_sends=5) for _ in range(2))
    try:
        clean(first.engine)
        for i in range(4):
            add_stub(first, f"m{i}", queue_offset=None, resend_at=T0 - dt.timedelta(seconds=9 - i))
        hung, other = BlockedSender(), QueueSender()
        thread, errors = sweep_in_background(Sweeper(first, hung, batch=2, clock=clock, max_batches=1))
        assert hung.entered.wait(10)
        with lock_wait_limit(second, seconds=2):  # fail instead of waiting behind the first sweeper
            summary = Sweeper(second, other, clock=clock).run_once()
        hung.release.set()
        thread.join(30)
        assert not errors, errors
        assert sorted(other.ids()) == ["m2", "m3"] and summary.resent == 2
        assert Counter(hung.ids() + other.ids()) == Counter({"m0": 1, "m1": 1, "m2": 1, "m3": 1})
        assert [get_inbox(first, f"m{i}").resend_count for i in range(4)] == [1, 1, 1, 1]
    finally:
        first.close()
        second.close()


def test_a_send_that_outlasts_its_claim_does_not_overwrite_the_next_claims_schedule(
    rel: Reliability, clock: Clock
) -> None:
    """The first sweeper's send hangs past its 10 s claim; a second sweeper claims the row, sends and
    records it. The first's late record is history only: both copies are counted, and the row keeps the
    schedule of the newer send (the first wrote its own due time over it, and its error when its send
    failed)."""
    add_stub(rel, "m", queue_offset=None)
    hung = BlockedSender(fail=True)
    first = Sweeper(rel, hung, backoff=FixedBackoff((7200.0,)), clock=clock, claim_ttl_s=10)
    thread, errors = sweep_in_background(first)
    assert hung.entered.wait(10)
    clock.advance(11)  # the first claim has ended
    assert Sweeper(rel, QueueSender(), backoff=FixedBackoff((60.0,)), clock=clock).run_once().resent == 1
    second_due = get_inbox(rel, "m").resend_at
    hung.release.set()
    thread.join(30)
    assert not errors, errors
    row = get_inbox(rel, "m")
    assert (row.resend_count, row.resend_at, row.last_error) == (2, second_due, None)


@contextlib.contextmanager
def lock_wait_limit(rel: Reliability, seconds: int) -> Iterator[None]:
    """Every connection of ``rel`` gives up on a row lock after ``seconds``."""
    if rel.engine.dialect.name == "postgresql":
        statement = f"SET lock_timeout = '{seconds}s'"
    else:
        statement = f"SET SESSION innodb_lock_wait_timeout = {seconds}"

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        cursor.execute(statement)
        cursor.close()

    rel.engine.dispose()
    event.listen(rel.engine, "connect", on_connect)
    try:
        yield
    finally:
        event.remove(rel.engine, "connect", on_connect)


ROOT = Path(__file__).resolve().parents[2]


def test_rows_of_a_sweeper_killed_mid_send_are_due_again_after_the_claim_window(
    rel: Reliability, db_url: str, tmp_path: Path
) -> None:
    """``reliable sweep --once`` killed (SIGKILL) while its send hangs: nothing was recorded, and the row
    is neither lost nor sent again by another sweeper before the claim window ends — then it is."""
    now = utcnow()
    add_stub(rel, "m", queue_offset=None, send_count=2, resend_at=now - dt.timedelta(minutes=1))
    journal = tmp_path / "sends.log"
    env = {**os.environ, "RELIABLE_TEST_SEND_LOG": str(journal), "RELIABLE_TEST_SEND_DELAY_S": "120"}
    env["PYTHONPATH"] = str(ROOT)
    cli = "import sys; from reliable.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = ["sweep", "--once", "--db", db_url, "--sender", "tests.sweeper.senders:slow_failing_sender"]
    proc = subprocess.Popen([sys.executable, "-c", cli, *argv], cwd=ROOT, env=env, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: journal.exists() and "start" in journal.read_text(), what="the send to start")
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    row = get_inbox(rel, "m")
    assert (row.status, row.resend_count, row.last_error) == (StubStatus.PENDING, 1, None)
    sender = QueueSender()
    assert Sweeper(rel, sender, clock=lambda: utcnow()).run_once().resent == 0  # still claimed
    after = utcnow() + dt.timedelta(seconds=C.DEFAULT_CLAIM_TTL_S + 1)
    assert Sweeper(rel, sender, clock=lambda: after).run_once().resent == 1
    assert sender.ids() == ["m"] and get_inbox(rel, "m").resend_count == 2
