"""Exactly once per consumer group (DESIGN.md §1–§2): fan-out, late groups, attempts, twins, retry positions.

Several groups on one topic is the normal RocketMQ/Kafka topology: each group must apply each message once,
with or without a producer stub, whatever Redis does meanwhile.
"""

from __future__ import annotations

import multiprocessing
import threading
import uuid

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text
from sqlalchemy.orm import Session

from reliable import ConsumeResult, Envelope, Reason, Reliability, StubStatus, idempotent_consumer, outbox
from reliable.models import utcnow
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.stores.lease import lease_key
from tests.conftest import _ensure_clean_schema
from tests.core.guard_helpers import (
    add_stub,
    apply,
    child_fan_out,
    env,
    inbox_attempts,
    inbox_status,
    ledger_writer,
    make_rel,
    per_group,
    settled,
    stub_status,
)
from tests.services import PrivateRedis

GROUPS = ["billing", "audit", "search"]


def uid(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


# --- fan-out -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("redis_mode", ["on", "off", "flushed"])
def test_three_groups_with_threads_each_apply_every_message_once(
    db_url: str, private_redis: PrivateRedis, key_prefix: str, redis_mode: str
) -> None:
    """Half the messages staged for all three groups, half not (inbox pattern); two threads per group deliver
    every message twice; with ``flushed`` Redis loses every key between the two rounds."""
    rel = make_rel(db_url, None if redis_mode == "off" else private_redis.url, key_prefix)
    ids = [uid("f") for _ in range(12)]
    for m in ids[::2]:
        add_stub(rel, m, GROUPS)
    handlers = {
        g: idempotent_consumer(rel, group=g, registry=CollectorRegistry())(ledger_writer(g)) for g in GROUPS
    }
    answers: list[object] = []
    errors: list[BaseException] = []

    def deliver(group: str, order: list[str]) -> None:
        try:
            for m in order:
                answers.extend(settled(handlers[group], env(m)))
        except BaseException as exc:
            errors.append(exc)

    def round_() -> None:
        threads = [
            threading.Thread(target=deliver, args=(g, ids if n == 0 else ids[::-1]))
            for g in GROUPS
            for n in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors

    try:
        round_()
        if redis_mode == "flushed":
            assert rel.redis is not None
            rel.redis.flushall()
        round_()
        assert per_group(rel) == {(g, m): 1 for g in GROUPS for m in ids}
        assert all(inbox_status(rel, g, m) is StubStatus.CONFIRMED for g in GROUPS for m in ids)
        assert ConsumeResult.DEAD_LETTER not in answers
        # the stub follows its inbox rows, also when groups confirm it at the same instant
        assert {stub_status(rel, m) for m in ids[::2]} == {StubStatus.CONFIRMED}
    finally:
        rel.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "redis_mode"),
    [
        ("sqlite", "on"),
        ("postgres", "on"),
        ("mariadb", "on"),
        ("postgres", "off"),
        ("sqlite", "flushed"),
        ("mariadb", "flushed"),
    ],
)
def test_three_groups_in_two_processes_apply_every_message_once(
    request: pytest.FixtureRequest, private_redis: PrivateRedis, key_prefix: str, kind: str, redis_mode: str
) -> None:
    """Two worker processes, each hosting all three groups, start at different ids; two rounds (the second
    all duplicates), with Redis flushed between them in ``flushed`` mode."""
    db_url: str = request.getfixturevalue(f"{kind}_url")
    _ensure_clean_schema(db_url)
    redis_url = None if redis_mode == "off" else private_redis.url
    rel = make_rel(db_url, redis_url, key_prefix)
    ids = [uid("p") for _ in range(10)]
    for m in ids[::2]:
        add_stub(rel, m, GROUPS)
    ctx = multiprocessing.get_context("spawn")

    def round_() -> None:
        barrier = ctx.Barrier(2, timeout=60)
        procs = [
            ctx.Process(
                target=child_fan_out, args=(db_url, redis_url, key_prefix, ids[n:] + ids[:n], GROUPS, barrier)
            )
            for n in (0, 5)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(180)
        assert [p.exitcode for p in procs] == [0, 0]

    try:
        round_()
        if redis_mode == "flushed":
            assert rel.redis is not None
            rel.redis.flushall()
        round_()
        assert per_group(rel) == {(g, m): 1 for g in GROUPS for m in ids}
        assert {stub_status(rel, m) for m in ids[::2]} == {StubStatus.CONFIRMED}
    finally:
        rel.close()


def test_a_group_joining_late_processes_what_it_never_saw(
    db_url: str, redis_url: str, key_prefix: str, registry: CollectorRegistry
) -> None:
    """Messages staged for billing only; audit subscribes later and replays the topic: its own inbox rows."""
    rel = make_rel(db_url, redis_url, key_prefix)
    billing = idempotent_consumer(rel, group="billing", registry=registry)(ledger_writer("billing"))
    audit = idempotent_consumer(rel, group="audit", registry=registry)(ledger_writer("audit"))
    ids = [uid("l") for _ in range(4)]
    try:
        for m in ids:
            add_stub(rel, m, "billing")
            assert billing(env(m)) is ConsumeResult.SUCCESS
        assert {stub_status(rel, m) for m in ids} == {StubStatus.CONFIRMED}  # every *expected* group
        for _ in range(2):  # the replay, twice
            assert [audit(env(m)) for m in ids] == [ConsumeResult.SUCCESS] * 4
        assert per_group(rel) == {(g, m): 1 for g in ("billing", "audit") for m in ids}
        assert {inbox_status(rel, "audit", m) for m in ids} == {StubStatus.CONFIRMED}
    finally:
        rel.close()


def test_a_groups_row_whose_stub_was_deleted_is_confirmed_by_the_copy_that_arrives(
    db_url: str, redis_url: str, key_prefix: str, registry: CollectorRegistry
) -> None:
    """The sweeper holds such a row while a copy may still arrive (it cannot re-send without a body): that
    copy must confirm the row once, for that group only, with the stub gone."""
    rel = make_rel(db_url, redis_url, key_prefix)
    billing = idempotent_consumer(rel, group="billing", registry=registry)(ledger_writer("billing"))
    m = uid("o")
    try:
        add_stub(rel, m, ["billing", "audit"])
        with rel.engine.begin() as conn:
            conn.execute(text("DELETE FROM message_stub WHERE message_id = :m"), {"m": m})
        assert [billing(env(m)) for _ in range(2)] == [ConsumeResult.SUCCESS] * 2
        assert per_group(rel) == {("billing", m): 1}
        assert inbox_status(rel, "billing", m) is StubStatus.CONFIRMED
        assert inbox_status(rel, "audit", m) is StubStatus.PENDING
        assert stub_status(rel, m) is None
    finally:
        rel.close()


# --- attempts ----------------------------------------------------------------------------------------------
def test_attempts_count_handler_failures_of_the_group_only(
    db_url: str, redis_url: str, key_prefix: str, registry: CollectorRegistry
) -> None:
    rel = make_rel(db_url, redis_url, key_prefix, max_attempts=2)
    fail = {"billing": True}

    def handler(e: Envelope, session: Session) -> None:
        apply(e, session)
        if fail["billing"]:
            raise RuntimeError("downstream said no")

    billing = idempotent_consumer(rel, group="billing", registry=registry)(handler)
    audit = idempotent_consumer(rel, group="audit", registry=registry)(ledger_writer("audit"))
    m = uid("a")
    add_stub(rel, m, ["billing", "audit"])
    assert rel.redis is not None
    key = lease_key(rel.settings.key_prefix, "billing", m)
    try:
        rel.redis.set(key, "processing:someone-else", px=60_000)
        for n in range(5):  # a live lease elsewhere: retried, never counted
            d = billing.decide(env(m, reconsume_times=n))
            assert (d.reason, d.attempts) == (Reason.LEASE_CONFLICT, None)
        assert inbox_attempts(rel, "billing", m) == 0
        rel.redis.delete(key)
        assert audit(env(m)) is ConsumeResult.SUCCESS  # the other group's success is not billing's
        d = billing.decide(env(m, reconsume_times=5))
        assert (d.reason, d.attempts) == (Reason.HANDLER_FAILED, 1)
        assert (inbox_attempts(rel, "billing", m), inbox_attempts(rel, "audit", m)) == (1, 0)
        d = billing.decide(env(m, reconsume_times=6))
        assert (d.result, d.reason, d.attempts) == (ConsumeResult.DEAD_LETTER, Reason.MAX_ATTEMPTS, 2)
    finally:
        rel.close()


def test_a_targeted_resend_and_revive_reset_attempts(
    db_url: str, key_prefix: str, registry: CollectorRegistry
) -> None:
    rel = make_rel(db_url, None, key_prefix, max_attempts=3)

    def handler(e: Envelope, session: Session) -> None:
        raise RuntimeError("still failing")

    handle = idempotent_consumer(rel, group="g", registry=registry)(handler)
    m = uid("r")
    add_stub(rel, m, ["g", "other"])
    try:
        assert [handle.decide(env(m)).attempts for _ in range(2)] == [1, 2]
        now = utcnow()
        resend = OutgoingMessage(m, "orders", b"{}", send_count=1, target_group="g")
        with rel.engine.begin() as conn:
            outbox.record_sends(conn, [(outbox.SendAttempt(resend, SendReceipt(0, 9)), now)], now)
        assert inbox_attempts(rel, "g", m) == 0  # a fresh copy gets the full budget again
        assert handle.decide(env(m)).reason is Reason.HANDLER_FAILED
        with rel.engine.begin() as conn:
            assert outbox.mark_dead(conn, m, "g", now, "resends exhausted")
        assert (inbox_status(rel, "g", m), stub_status(rel, m)) == (StubStatus.DEAD, StubStatus.DEAD)
        with rel.engine.begin() as conn:
            assert outbox.revive(conn, m, now, group="g") == 1
        assert (inbox_status(rel, "g", m), inbox_attempts(rel, "g", m)) == (StubStatus.PENDING, 0)
        assert stub_status(rel, m) is StubStatus.PENDING
    finally:
        rel.close()


# --- twins -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stubbed", [True, False], ids=["stub", "inbox"])
def test_a_tampered_twin_in_one_batch_is_dead_lettered(
    db_url: str, redis_url: str, key_prefix: str, registry: CollectorRegistry, stubbed: bool
) -> None:
    rel = make_rel(db_url, redis_url, key_prefix)
    handle = idempotent_consumer(rel, group="g", registry=registry)(apply)
    m = uid("t")
    if stubbed:
        add_stub(rel, m, "g", body=b"A")
    try:
        decisions = handle.decide_batch([env(m, b"A"), env(m, b"B"), env(m, b"A")])
        assert [(d.result, d.reason) for d in decisions] == [
            (ConsumeResult.SUCCESS, Reason.PROCESSED),
            (ConsumeResult.DEAD_LETTER, Reason.PAYLOAD_MISMATCH),
            (ConsumeResult.SUCCESS, Reason.DUPLICATE_IN_BATCH),
        ]
        assert per_group(rel) == {("x", m): 1}  # apply() notes "x"
    finally:
        rel.close()


def test_twin_of_a_failed_first_is_retried_not_judged(
    db_url: str, key_prefix: str, registry: CollectorRegistry
) -> None:
    rel = make_rel(db_url, None, key_prefix)

    def handler(e: Envelope, session: Session) -> None:
        raise RuntimeError("no")

    handle = idempotent_consumer(rel, group="g", registry=registry)(handler)
    m = uid("t")
    try:
        reasons = [d.reason for d in handle.decide_batch([env(m, b"A"), env(m, b"B")])]
        assert reasons == [Reason.HANDLER_FAILED, Reason.LEASE_CONFLICT]
    finally:
        rel.close()


# --- positions ---------------------------------------------------------------------------------------------
def test_a_retry_delivery_journals_its_own_position_and_moves_only_its_queue(
    db_url: str, key_prefix: str, registry: CollectorRegistry
) -> None:
    rel = make_rel(db_url, None, key_prefix)
    handle = idempotent_consumer(rel, group="g", registry=registry)(apply)
    first, retried = uid("o"), uid("r")
    try:
        assert handle(Envelope(first, "orders", 0, 10, b"{}")) is ConsumeResult.SUCCESS
        assert handle(Envelope(first, "orders", 1, 4, b"{}")) is ConsumeResult.SUCCESS
        # a %RETRY%g delivery: its own queue 0 at offset 3 — not orders' queue 0, not orders' queue 1
        retry = Envelope(retried, "orders", 0, 3, b"{}", reconsume_times=1, delivered_topic="%RETRY%g")
        assert retry.source_topic == "%RETRY%g"
        assert handle(retry) is ConsumeResult.SUCCESS
        with rel.engine.connect() as conn:
            marks = conn.execute(text("SELECT topic, queue_id, max_offset FROM consume_progress")).all()
            row = conn.execute(
                text(
                    "SELECT topic, queue_id, queue_offset, original_topic FROM message_log"
                    " WHERE message_id = :m"
                ),
                {"m": retried},
            ).one()
        assert sorted(tuple(r) for r in marks) == [("%RETRY%g", 0, 3), ("orders", 0, 10), ("orders", 1, 4)]
        assert tuple(row) == ("%RETRY%g", 0, 3, "orders")
    finally:
        rel.close()


# --- the stub's status, derived -----------------------------------------------------------------------------
def test_settle_repairs_a_stub_left_behind_by_another_writer(db_url: str) -> None:
    """Inbox rows confirmed outside the guard (a person's SQL): the sweeper's settle brings the stub along."""
    with Reliability(db_url) as rel:
        m = uid("s")
        add_stub(rel, m, ["a", "b"])
        with rel.engine.begin() as conn:
            conn.execute(
                text("UPDATE message_inbox SET status = 'CONFIRMED' WHERE message_id = :m"), {"m": m}
            )
        assert stub_status(rel, m) is StubStatus.PENDING
        with rel.engine.begin() as conn:
            assert outbox.settle(conn, utcnow()) >= 1
        assert stub_status(rel, m) is StubStatus.CONFIRMED
