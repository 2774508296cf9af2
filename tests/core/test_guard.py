"""The consumer guard against real SQLite, PostgreSQL, MariaDB and Redis: DESIGN.md §2 step by step.

The invariant everywhere: a ledger row written through ``session`` exists exactly once per message that was
ever acknowledged, and never for a message that was not.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text
from sqlalchemy.orm import Session

from reliable import ConsumeResult, Envelope, Reason, Reliability, idempotent_consumer
from reliable.errors import BadMessageError, MissingMessageIdError, PayloadMismatchError
from reliable.stores.lease import lease_key
from reliable.types import LogOutcome, StubStatus
from tests.core.guard_helpers import (
    add_stub,
    applied,
    apply,
    counting,
    env,
    failed_send,
    inbox_attempts,
    inbox_error,
    inbox_status,
    log_rows,
    make_rel,
    per_message,
    stub_error,
    stub_status,
    uid,
)


@pytest.fixture
def rel(db_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    r = make_rel(db_url, redis_url, key_prefix, max_attempts=3)
    yield r
    r.close()


# --- duplicates ------------------------------------------------------------------------------------------
def test_duplicates_in_every_order_apply_once(rel: Reliability, registry: CollectorRegistry) -> None:
    handle, calls = counting(rel, registry)
    schedules = sorted(set(itertools.permutations("aabbc")))
    for n, schedule in enumerate(schedules):
        ids = {t: f"o{n}-{t}" for t in "abc"}
        add_stub(rel, ids["b"], "g")  # b: producer wrote a stub; a and c: inbox pattern
        first: set[str] = set()
        for t in schedule:
            d = handle.decide(env(ids[t]))
            assert d.result is ConsumeResult.SUCCESS
            assert d.duplicate == (t in first)
            first.add(t)
    assert set(per_message(rel).values()) == {1}
    assert len(per_message(rel)) == 3 * len(schedules) == len(calls)


def test_duplicate_after_redis_lost_key_is_caught_by_database(
    rel: Reliability, registry: CollectorRegistry
) -> None:
    handle, _ = counting(rel, registry)
    m = uid("m")
    assert handle.decide(env(m)).reason is Reason.PROCESSED
    assert handle.decide(env(m)).reason is Reason.DUPLICATE_DONE_MARKER
    assert rel.redis is not None
    rel.redis.delete(lease_key(rel.settings.key_prefix, "g", m))
    assert handle.decide(env(m)).reason is Reason.DUPLICATE_CONFIRMED
    assert applied(rel, m) == 1
    handle.flush_journal()  # the done-marker duplicate's row is written behind (the default)
    assert [r[1] for r in log_rows(rel, m)] == ["SUCCESS", "DUPLICATE", "DUPLICATE"]


def test_database_only_mode(db_url: str, key_prefix: str, registry: CollectorRegistry) -> None:
    rel = make_rel(db_url, None, key_prefix)
    try:
        handle, _ = counting(rel, registry)
        m = uid("m")
        assert [handle.decide(env(m)).reason for _ in range(3)] == [
            Reason.PROCESSED,
            Reason.DUPLICATE_CONFIRMED,
            Reason.DUPLICATE_CONFIRMED,
        ]
        assert applied(rel, m) == 1
    finally:
        rel.close()


# --- failures ----------------------------------------------------------------------------------------------
def test_fail_then_succeed_applies_once(rel: Reliability, registry: CollectorRegistry) -> None:
    failures = {"left": 2}

    @idempotent_consumer(rel, group="g", registry=registry)
    def handle(e: Envelope, session: Session) -> None:
        apply(e, session)  # written, then rolled back when we raise
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("downstream said no")

    m = uid("m")
    add_stub(rel, m, "g")
    failed_send(rel, m)  # the producer's send failed: the stub shows why until the message is applied
    d1 = handle.decide(env(m))
    assert (d1.result, d1.reason, d1.attempts) == (ConsumeResult.RECONSUME_LATER, Reason.HANDLER_FAILED, 1)
    assert applied(rel, m) == 0
    assert stub_status(rel, m) is StubStatus.PENDING
    # the lease was released by compare-and-delete: the redelivery runs at once instead of waiting it out
    d2 = handle.decide(env(m, reconsume_times=1))
    assert d2.reason is Reason.HANDLER_FAILED and d2.attempts == 2
    assert "downstream said no" in (inbox_error(rel, "g", m) or "")
    d3 = handle.decide(env(m, reconsume_times=2))
    assert d3.reason is Reason.PROCESSED
    assert applied(rel, m) == 1
    assert stub_status(rel, m) is StubStatus.CONFIRMED
    # applied: the row no longer shows an error (the journal keeps the failed attempts), its count stays
    assert (inbox_error(rel, "g", m), inbox_attempts(rel, "g", m)) == (None, 2)
    assert stub_error(rel, m) is None
    assert [r[1] for r in log_rows(rel, m)] == ["RETRY", "RETRY", "SUCCESS"]
    # the same through a batch's confirm
    b, c, d = uid("b"), uid("c"), uid("d")
    for mid in (b, c, d):
        add_stub(rel, mid, "g")
        failed_send(rel, mid)
    failures["left"] = 1
    assert [x.reason for x in handle.decide_batch([env(b), env(c)])] == [
        Reason.HANDLER_FAILED,
        Reason.PROCESSED,
    ]
    assert inbox_error(rel, "g", b) is not None
    again = handle.decide_batch([env(b, reconsume_times=1), env(d)])
    assert [x.reason for x in again] == [Reason.PROCESSED] * 2
    assert inbox_error(rel, "g", b) is None
    assert stub_error(rel, b) is None and stub_error(rel, d) is None


def test_inbox_row_rolled_back_with_failed_handler(rel: Reliability, registry: CollectorRegistry) -> None:
    @idempotent_consumer(rel, group="g", registry=registry)
    def handle(e: Envelope, session: Session) -> None:
        apply(e, session)
        raise ValueError("nope")

    m = uid("m")
    assert handle(env(m)) is ConsumeResult.RECONSUME_LATER
    # the CONFIRMED inbox row did not survive the rollback; the failure is counted on a PENDING one
    assert inbox_status(rel, "g", m) is StubStatus.PENDING and inbox_attempts(rel, "g", m) == 1
    assert stub_status(rel, m) is None  # the guard never writes a producer's stub
    assert applied(rel, m) == 0


@pytest.mark.parametrize("reconsume_base", [0, 15], ids=["first_delivery", "after_15_redeliveries"])
def test_max_attempts_dead_letters(
    rel: Reliability, registry: CollectorRegistry, reconsume_base: int
) -> None:
    """Attempts are this group's handler failures, whatever the broker's redelivery count says.

    A message redelivered 15 times for lease conflicts or outages has not failed in a handler once: its
    first real failure is attempt 1, not an instant dead letter.
    """

    @idempotent_consumer(rel, group="g", registry=registry)
    def handle(e: Envelope, session: Session) -> None:
        raise RuntimeError("always")

    m = uid("m")
    decisions = [
        handle.decide(env(m, reconsume_times=reconsume_base + n)) for n in range(3)
    ]  # max_attempts=3
    assert [(d.reason, d.attempts) for d in decisions] == [
        (Reason.HANDLER_FAILED, 1),
        (Reason.HANDLER_FAILED, 2),
        (Reason.MAX_ATTEMPTS, 3),
    ]
    last = log_rows(rel, m)[-1]
    assert last[1] == LogOutcome.DEAD_LETTER and last[2] is not None and last[2].startswith("max_attempts")


def test_handler_that_rolls_back_the_session_is_a_failure(
    rel: Reliability, registry: CollectorRegistry
) -> None:
    @idempotent_consumer(rel, group="g", registry=registry)
    def handle(e: Envelope, session: Session) -> None:
        apply(e, session)
        session.rollback()

    m = uid("m")
    d = handle.decide(env(m))
    assert d.reason is Reason.HANDLER_FAILED
    assert applied(rel, m) == 0 and inbox_status(rel, "g", m) is StubStatus.PENDING


# --- bad input -------------------------------------------------------------------------------------------
def test_payload_mismatch_dead_letters_with_reason(rel: Reliability, registry: CollectorRegistry) -> None:
    handle, calls = counting(rel, registry)
    m = uid("m")
    add_stub(rel, m, "g", body=b"original")
    d = handle.decide(env(m, b"tampered"))
    assert d.result is ConsumeResult.DEAD_LETTER and d.reason is Reason.PAYLOAD_MISMATCH
    assert isinstance(d.error, PayloadMismatchError)
    assert calls == [] and stub_status(rel, m) is StubStatus.PENDING
    assert log_rows(rel, m)[-1][1] == "DEAD_LETTER"
    assert "payload_mismatch" in str(log_rows(rel, m)[-1][2])
    # the right body still goes through, once
    assert handle.decide(env(m, b"original")).reason is Reason.PROCESSED
    # after success the done marker carries a hash tag: a different body is not mistaken for a duplicate
    assert handle.decide(env(m, b"tampered")).reason is Reason.PAYLOAD_MISMATCH
    assert handle.decide(env(m, b"original")).reason is Reason.DUPLICATE_DONE_MARKER
    assert applied(rel, m) == 1


def test_missing_message_id_dead_letters_with_reason(rel: Reliability, registry: CollectorRegistry) -> None:
    handle, calls = counting(rel, registry)
    for missing in (None, "", "   "):  # blank: every blank delivery would be one message's duplicate
        d = handle.decide(env(missing))
        assert d.result is ConsumeResult.DEAD_LETTER and d.reason is Reason.MISSING_MESSAGE_ID
        assert isinstance(d.error, MissingMessageIdError)
    rows = log_rows(rel, "") + log_rows(rel, "   ")
    assert len(rows) == 3 and all(r[1] == "DEAD_LETTER" and "missing_message_id" in str(r[2]) for r in rows)
    assert calls == []


def test_oversized_id_dead_letters(rel: Reliability, registry: CollectorRegistry) -> None:
    handle, calls = counting(rel, registry)
    d = handle.decide(env("x" * 65))
    assert d.reason is Reason.BAD_MESSAGE and calls == []


def test_a_delivery_its_adapter_could_not_read_is_journaled_as_bad_input_never_run(
    rel: Reliability, registry: CollectorRegistry
) -> None:
    """``Envelope.bad_input`` (a Kafka record with a header that is not UTF-8): dead-lettered with the
    adapter's reason and journaled at its position, even under an id a real message has — no lease, no inbox
    row touched, the handler never runs."""
    handle, calls = counting(rel, registry)
    add_stub(rel, "real-1", "g")
    d = handle.decide(replace(env("real-1"), bad_input="undecodable: header 'x' is not UTF-8"))
    assert d.result is ConsumeResult.DEAD_LETTER and d.reason is Reason.BAD_MESSAGE
    assert isinstance(d.error, BadMessageError) and calls == []
    assert log_rows(rel, "real-1") == [
        ("real-1", "DEAD_LETTER", "bad_message: undecodable: header 'x' is not UTF-8")
    ]
    assert inbox_status(rel, "g", "real-1") is StubStatus.PENDING and inbox_attempts(rel, "g", "real-1") == 0
    assert handle(env("real-1")) is ConsumeResult.SUCCESS and calls == ["real-1"]  # the readable copy runs


def test_voided_stub_is_skipped(rel: Reliability, registry: CollectorRegistry) -> None:
    handle, calls = counting(rel, registry)
    m = uid("m")
    add_stub(rel, m, "g", status=StubStatus.VOIDED)
    d = handle.decide(env(m))
    assert (d.result, d.reason) == (ConsumeResult.SUCCESS, Reason.VOIDED)
    assert calls == [] and stub_status(rel, m) is StubStatus.VOIDED


def test_dead_stub_is_processed_and_confirmed(rel: Reliability, registry: CollectorRegistry) -> None:
    handle, _ = counting(rel, registry)
    m = uid("m")
    add_stub(rel, m, "g", status=StubStatus.DEAD)
    assert handle.decide(env(m)).reason is Reason.PROCESSED
    assert stub_status(rel, m) is StubStatus.CONFIRMED


def test_every_group_processes_a_message_staged_for_several(
    rel: Reliability, registry: CollectorRegistry
) -> None:
    """Fan-out: a message staged for two groups is processed once by each (it used to dead-letter group 2)."""
    seen: list[str] = []

    def handler_for(group: str):  # type: ignore[no-untyped-def]
        def handle(e: Envelope, session: Session) -> None:
            seen.append(group)
            apply(e, session, note=group)

        return idempotent_consumer(rel, group=group, registry=registry)(handle)

    billing, audit, late = handler_for("billing"), handler_for("audit"), handler_for("late")
    m = uid("m")
    add_stub(rel, m, ["billing", "audit"])
    assert [billing.decide(env(m)).reason for _ in range(2)] == [
        Reason.PROCESSED,
        Reason.DUPLICATE_DONE_MARKER,
    ]
    assert stub_status(rel, m) is StubStatus.PENDING  # audit has not confirmed yet
    assert audit.decide(env(m)).reason is Reason.PROCESSED
    assert stub_status(rel, m) is StubStatus.CONFIRMED  # every expected group confirmed
    # a group the producer did not expect (it joined later) processes it too: inbox pattern, its own row
    assert late.decide(env(m)).reason is Reason.PROCESSED
    assert late.decide(env(m)).result is ConsumeResult.SUCCESS
    assert inbox_status(rel, "late", m) is StubStatus.CONFIRMED
    assert sorted(seen) == ["audit", "billing", "late"] and applied(rel, m) == 3


# --- leases ------------------------------------------------------------------------------------------------
def test_live_foreign_lease_means_reconsume_later(rel: Reliability, registry: CollectorRegistry) -> None:
    """The seed answered SUCCESS here and lost the message when the lease holder died."""
    handle, calls = counting(rel, registry)
    m = uid("m")
    add_stub(rel, m, "g")
    assert rel.redis is not None
    key = lease_key(rel.settings.key_prefix, "g", m)
    rel.redis.set(key, "processing:someone-else", px=60_000)
    d = handle.decide(env(m))
    assert (d.result, d.reason) == (ConsumeResult.RECONSUME_LATER, Reason.LEASE_CONFLICT)
    assert calls == [] and rel.redis.get(key) == b"processing:someone-else"  # not ours: not deleted
    # the holder committed but had not yet written `done`: the stub says CONFIRMED, so it is a duplicate
    with rel.engine.begin() as conn:
        conn.exec_driver_sql(
            f"UPDATE message_inbox SET status = 'CONFIRMED' WHERE consumer_group = 'g' AND message_id = '{m}'"
        )
    assert handle.decide(env(m)).reason is Reason.DUPLICATE_CONFIRMED
    assert calls == []


def test_a_value_no_column_can_hold_is_dead_lettered_not_retried_for_ever_nor_changed(
    rel: Reliability, registry: CollectorRegistry
) -> None:
    """A NUL in an id: PostgreSQL's prepared statements cut ``k\\x00A`` to ``k`` (confirmed as ``k``: the
    real ``k`` later answered as its duplicate, never run), a fresh connection refuses it. A position wider
    than its column is refused by every database. Refused, each was answered "database unavailable" for
    ever — a poison delivery blocking its queue. Now bad input: dead-lettered with the reason, journaled
    with values the columns hold, and no watermark raised by an impossible offset. A forged attempt count
    is only clamped."""
    handle, calls = counting(rel, registry)
    for _ in range(6):  # psycopg prepares a statement from its fifth run on: the cut happened then
        assert handle.decide(env(uid("warm"))).reason is Reason.PROCESSED
    calls.clear()
    k = uid("k")
    bad = [
        env(k + "\x00A"),
        env(k + "\ud800"),
        replace(env(uid("q")), queue_id=2**31),
        replace(env(uid("o")), queue_offset=2**63),
    ]
    for e in bad:
        d = handle.decide(e)
        assert (d.result, d.reason) == (ConsumeResult.DEAD_LETTER, Reason.BAD_MESSAGE), d
        assert isinstance(d.error, BadMessageError) and "no column can hold it" in str(d.error)
    assert calls == []
    assert handle.decide(env(k)).reason is Reason.PROCESSED and calls == [k]
    journaled = [(m, outcome) for m, outcome, _ in log_rows(rel)][-5:]
    assert journaled[:2] == [(k + "\\x00A", "DEAD_LETTER"), (k + "\\ud800", "DEAD_LETTER")]
    with rel.engine.connect() as conn:
        highest = conn.execute(text("SELECT max(max_offset) FROM consume_progress")).scalar_one()
    assert highest < 2**40
    forged = handle.decide(env(uid("n"), reconsume_times=2**31))
    assert forged.reason is Reason.PROCESSED
