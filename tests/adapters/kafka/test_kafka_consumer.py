"""The guarded Kafka consumer against a live Tansu broker, PostgreSQL and Redis (no mocks)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from sqlalchemy import select
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, idempotent_consumer
from reliable import constants as C
from reliable.adapters.kafka import KafkaGuardedConsumer, RetryMode, RetryPolicy, ensure_topics, offsets_in_db
from reliable.demo.tansu import FAST_GROUP, Tansu
from reliable.models import MessageInbox
from reliable.types import StubStatus
from tests.adapters.kafka.helpers import (
    BAD_RECORDS,
    TIMEOUT_S,
    apply_effect,
    assert_bad_records_dead_lettered,
    assert_bad_records_journaled,
    committed,
    effect_counts,
    headers_of,
    log_rows,
    make_consumer,
    produce,
    read_all,
    with_ids,
)

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.redis]


@pytest.mark.parametrize("batch", [False, True], ids=["per-record", "batch"])
def test_every_record_applied_once_and_offsets_committed_after_the_answer(
    tansu: Tansu, rel: Reliability, topic: str, group: str, batch: bool
) -> None:
    policy = RetryPolicy(delays_s=(0.3,))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic), partitions=3)
    ids = [f"m{i}" for i in range(30)]
    positions = produce(tansu.bootstrap, topic, with_ids(ids))
    positions += produce(tansu.bootstrap, topic, with_ids(["m3", "m7"]))  # a producer retry that landed twice
    handle = idempotent_consumer(rel, group=group)(apply_effect(group))
    with make_consumer(tansu.bootstrap, topic, group, handle, retry=policy, batch=batch) as consumer:
        assert consumer.run(
            until=lambda: consumer.counts["success"] + consumer.counts["duplicate"] >= 32, timeout_s=TIMEOUT_S
        )
        assert consumer.counts["duplicate"] == 2
    assert effect_counts(rel.engine, group) == {i: 1 for i in ids}
    handle.flush_journal()  # duplicates answered by Redis are journaled write-behind
    dups = [(m, r) for m, o, r in log_rows(rel.engine, group) if o == "DUPLICATE"]
    assert sorted(m for m, _ in dups) == ["m3", "m7"]
    ends = [max((o + 1 for p, o in positions if p == part), default=-1001) for part in range(3)]
    assert committed(tansu.bootstrap, group, topic, 3) == ends


@pytest.mark.parametrize("batch", [False, True], ids=["per-record", "batch"])
def test_failures_hop_through_retry_topics_with_growing_delays_then_the_dlt(
    tansu: Tansu, rel: Reliability, topic: str, group: str, batch: bool
) -> None:
    policy = RetryPolicy(delays_s=(0.4, 0.8))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    calls: dict[str, list[tuple[float, str, int]]] = {}

    def handler(env: Envelope, session: Session) -> None:
        calls.setdefault(env.message_id or "", []).append(
            (time.time(), env.source_topic, env.reconsume_times)
        )
        if env.message_id == "always-fails" or (env.message_id == "fails-once" and env.reconsume_times == 0):
            raise RuntimeError(f"boom {env.message_id}")
        apply_effect(group)(env, session)

    handle = idempotent_consumer(rel, group=group)(handler)
    produce(tansu.bootstrap, topic, with_ids(["ok", "fails-once", "always-fails"]))
    with make_consumer(tansu.bootstrap, topic, group, handle, retry=policy, batch=batch) as consumer:
        assert consumer.run(
            until=lambda: consumer.counts["dead_letter"] >= 1 and consumer.counts["success"] >= 2,
            timeout_s=TIMEOUT_S,
        )
    assert effect_counts(rel.engine, group) == {"ok": 1, "fails-once": 1}
    # the failing record went topic → retry.1 → retry.2 → dlt, each hop no earlier than its delay
    # (batch mode may run a failing handler twice in one delivery: the guard re-runs a failed batch's
    # records one savepoint each; the first call of each delivery counts)
    hops = [
        next(c for c in calls["always-fails"] if c[1:] == key)
        for key in dict.fromkeys(c[1:] for c in calls["always-fails"])
    ]
    assert [(t, n) for _, t, n in hops] == [(topic, 0), (f"{topic}.retry.1", 1), (f"{topic}.retry.2", 2)]
    assert hops[1][0] - hops[0][0] >= 0.4 - 0.05
    assert hops[2][0] - hops[1][0] >= 0.8 - 0.05
    assert list(dict.fromkeys((t, n) for _, t, n in calls["fails-once"])) == [
        (topic, 0),
        (f"{topic}.retry.1", 1),
    ]
    (dead,) = read_all(tansu.bootstrap, f"{topic}.dlt", expect=1)
    h = headers_of(dead)
    assert h[C.KAFKA_ID_HEADER] == "always-fails"
    assert (h[C.KAFKA_HEADER_ORIGINAL_TOPIC], h[C.KAFKA_HEADER_ORIGINAL_PARTITION]) == (topic, "0")
    assert h[C.KAFKA_HEADER_ORIGINAL_OFFSET] == "2"
    assert h[C.KAFKA_HEADER_ATTEMPT] == "3"
    # the last retry topic's delivery is the guard's last too: it dead-letters with its reason, journals it
    # and sets the group's row DEAD (the sweeper tells a person), instead of a PENDING row re-driven later
    assert "max_attempts: attempt 3/10, the broker's last delivery" in h[C.KAFKA_HEADER_REASON]
    assert "boom always-fails" in h[C.KAFKA_HEADER_REASON]
    assert [o for m, o, _ in log_rows(rel.engine, group) if m == "always-fails"][-1] == "DEAD_LETTER"
    with rel.engine.connect() as conn:
        row = conn.execute(
            select(MessageInbox.status, MessageInbox.attempts).where(
                MessageInbox.message_id == "always-fails"
            )
        ).one()
    # three handler failures (the journal says 3/10); the give-up spends the budget, so a later copy of the
    # message answers gave_up instead of running the handler again
    assert (row.status, row.attempts) == (StubStatus.DEAD, 10)
    assert dead.value() == b"body-always-fails"
    retry1 = [headers_of(m) for m in read_all(tansu.bootstrap, f"{topic}.retry.1", expect=2)]
    assert sorted(r[C.KAFKA_ID_HEADER] for r in retry1) == ["always-fails", "fails-once"]
    assert all(
        r[C.KAFKA_HEADER_ATTEMPT] == "1" and "handler_failed" in r[C.KAFKA_HEADER_REASON] for r in retry1
    )
    # every source offset is committed: nothing was left behind on any topic
    for t, n in zip(policy.topics(topic), (3, 2, 1), strict=True):
        assert committed(tansu.bootstrap, group, t, 1) == [n]


def test_blocking_retry_pauses_and_seeks_back_keeping_the_partition_order(
    tansu: Tansu, rel: Reliability, topic: str, group: str
) -> None:
    policy = RetryPolicy(delays_s=(0.3, 0.3), mode=RetryMode.BLOCKING)
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    order: list[str] = []
    failed: set[str] = set()

    def handler(env: Envelope, session: Session) -> None:
        if env.message_id == "m2" and "m2" not in failed:
            failed.add("m2")
            raise RuntimeError("first try of m2 fails")
        order.append(env.message_id or "")
        apply_effect(group)(env, session)

    handle = idempotent_consumer(rel, group=group)(handler)
    ids = [f"m{i}" for i in range(6)]
    produce(tansu.bootstrap, topic, with_ids(ids))
    with make_consumer(tansu.bootstrap, topic, group, handle, retry=policy) as consumer:
        assert consumer.run(until=lambda: consumer.counts["success"] >= 6, timeout_s=TIMEOUT_S)
        assert consumer.counts["held"] == 1
    assert order == ids
    assert read_all(tansu.bootstrap, f"{topic}.dlt", expect=0) == []


@pytest.mark.parametrize("batch", [False, True], ids=["per-record", "batch"])
def test_a_blocking_give_up_ends_the_groups_row_dead_and_journaled_not_pending(
    tansu: Tansu, rel: Reliability, topic: str, group: str, batch: bool
) -> None:
    """Blocking mode, two retries, a record whose handler always fails (no producer stub: the inbox
    pattern). The loop sent it to the DLT after three failures, but the guard never heard it was the last:
    the row stayed PENDING with only RETRY rows in the journal — nobody was ever told (with a stub, the
    sweeper re-drove the whole chain ``max_sends`` times). The third delivery is now the last attempt."""
    policy = RetryPolicy(delays_s=(0.2, 0.2), mode=RetryMode.BLOCKING)
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    runs: list[str] = []

    def handler(env: Envelope, session: Session) -> None:
        runs.append(env.message_id or "")
        if env.message_id == "poison":
            raise RuntimeError("always fails")
        apply_effect(group)(env, session)

    handle = idempotent_consumer(rel, group=group)(handler)
    produce(tansu.bootstrap, topic, with_ids(["ok-1", "poison", "ok-2"]))
    with make_consumer(tansu.bootstrap, topic, group, handle, retry=policy, batch=batch) as consumer:
        assert consumer.run(until=lambda: consumer.counts["success"] >= 2, timeout_s=TIMEOUT_S)
        assert consumer.counts["dead_letter"] == 1
    assert runs.count("poison") == 3
    with Session(rel.engine) as s:
        row = s.get(MessageInbox, (group, "poison"))
        assert row is not None and row.status is StubStatus.DEAD
    outcomes = [o for m, o, _ in log_rows(rel.engine, group) if m == "poison"]
    assert outcomes == ["RETRY", "RETRY", "DEAD_LETTER"]
    [dead] = read_all(tansu.bootstrap, f"{topic}.dlt", expect=1)
    assert headers_of(dead)[C.KAFKA_ID_HEADER] == "poison"
    assert effect_counts(rel.engine, group) == {"ok-1": 1, "ok-2": 1}


def test_bad_records_go_to_the_dlt_with_their_reason_and_are_never_committed_silently(
    tansu: Tansu, rel: Reliability, topic: str, group: str, caplog: pytest.LogCaptureFixture
) -> None:
    policy = RetryPolicy(delays_s=(0.3,))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    produce(tansu.bootstrap, topic, BAD_RECORDS)
    handle = idempotent_consumer(rel, group=group)(apply_effect(group))
    with make_consumer(
        tansu.bootstrap, topic, group, handle, retry=policy, allow_position_id=False
    ) as consumer:
        assert consumer.run(
            until=lambda: (
                consumer.counts["success"] >= 1
                and consumer.counts["dead_letter"] + consumer.counts["undecodable"] >= 2
            ),
            timeout_s=TIMEOUT_S,
        )
    assert_bad_records_dead_lettered(tansu.bootstrap, topic)
    assert_bad_records_journaled(rel.engine, group, topic)
    assert effect_counts(rel.engine, group) == {"fine": 1}
    assert committed(tansu.bootstrap, group, topic, 1) == [3]

    # with the positional fallback (the default) a record without id is processed, with a warning
    produce(tansu.bootstrap, topic, [(None, b"anonymous", [])])
    caplog.set_level(logging.WARNING, "reliable.adapters.kafka")
    with make_consumer(tansu.bootstrap, topic, group, handle, retry=policy) as consumer:
        assert consumer.run(until=lambda: consumer.counts["success"] >= 1, timeout_s=TIMEOUT_S)
    assert effect_counts(rel.engine, group) == {"fine": 1, f"{topic}-0-3": 1}
    assert "producer retry of it will look like a new message" in caplog.text


def test_an_undecodable_record_waits_while_the_journal_cannot_take_it(
    tansu: Tansu, rel: Reliability, topic: str, group: str
) -> None:
    """The journal row of an undecodable record comes before its dead-letter copy and its commit: with the
    database unreachable the record is held (not copied, not committed), and once it answers the row is
    written and the copy sent."""
    policy = RetryPolicy(delays_s=(0.2,))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    produce(tansu.bootstrap, topic, BAD_RECORDS[:1])
    down = Reliability(
        "postgresql+psycopg://postgres@127.0.0.1:16448/nowhere", key_prefix=rel.settings.key_prefix
    )
    unreachable = idempotent_consumer(down, group=group)(apply_effect(group))
    try:
        with make_consumer(tansu.bootstrap, topic, group, unreachable, retry=policy) as consumer:
            assert consumer.run(until=lambda: consumer.counts["held"] >= 3, timeout_s=TIMEOUT_S)
            assert consumer.counts["undecodable"] == 0
    finally:
        unreachable.close()
        down.close()
    assert committed(tansu.bootstrap, group, topic, 1) == [-1001]
    assert read_all(tansu.bootstrap, f"{topic}.dlt", expect=0, timeout_s=1.0) == []
    handle = idempotent_consumer(rel, group=group)(apply_effect(group))
    with make_consumer(tansu.bootstrap, topic, group, handle, retry=policy) as consumer:
        assert consumer.run(until=lambda: consumer.counts["undecodable"] >= 1, timeout_s=TIMEOUT_S)
    assert [(m, o) for m, o, _ in log_rows(rel.engine, group)] == [
        (f"undecodable:{topic}-0-0", "DEAD_LETTER")
    ]
    assert len(read_all(tansu.bootstrap, f"{topic}.dlt", expect=1)) == 1


class DropsKafkaCommits(KafkaGuardedConsumer):
    """Fault injection: every offset commit to Kafka is lost."""

    def _commit_to_kafka(self, offsets: list[TopicPartition]) -> None:
        self.counts["commit_dropped"] += 1


@pytest.mark.parametrize("db_offsets", [True, False], ids=["db-offsets", "kafka-offsets-only"])
def test_a_lost_offset_commit_replays_nothing_with_database_offsets(
    tansu: Tansu, rel: Reliability, topic: str, group: str, db_offsets: bool
) -> None:
    policy = RetryPolicy(delays_s=(0.3,))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic), partitions=2)
    handler = apply_effect(group)
    if db_offsets:
        handler = offsets_in_db(group)(handler)
    handle = idempotent_consumer(rel, group=group)(handler)
    ids = [f"m{i}" for i in range(10)]
    produce(tansu.bootstrap, topic, with_ids(ids))
    first = DropsKafkaCommits(
        tansu.bootstrap, topic, group, handle, retry=policy, rel=rel, db_offsets=db_offsets, config=FAST_GROUP
    )
    with first:
        assert first.run(until=lambda: first.counts["success"] >= 10, timeout_s=TIMEOUT_S)
    assert first.counts["commit_dropped"] >= 1
    assert committed(tansu.bootstrap, group, topic, 2) == [-1001, -1001]  # Kafka knows nothing
    # one new record per partition: a replay of older offsets would reach the handler before these
    late = ["late0", "late1"]
    for p, mid in enumerate(late):
        produce(tansu.bootstrap, topic, with_ids([mid]), partition=p)
    with make_consumer(
        tansu.bootstrap, topic, group, handle, retry=policy, rel=rel, db_offsets=db_offsets
    ) as second:
        assert second.run(until=lambda: second.counts["success"] >= 2, timeout_s=TIMEOUT_S)
    assert effect_counts(rel.engine, group) == {i: 1 for i in [*ids, *late]}
    handle.flush_journal()  # duplicates answered by Redis are journaled write-behind
    replayed = [m for m, o, _ in log_rows(rel.engine, group) if o == "DUPLICATE"]
    if db_offsets:
        assert replayed == [] and second.counts["duplicate"] == 0
    else:  # the control: without database offsets the whole lot comes again, absorbed by the guard
        assert sorted(replayed) == sorted(ids)


@pytest.mark.parametrize("db_offsets", [False, True], ids=["kafka-offsets", "database-offsets"])
def test_a_partition_held_across_a_rebalance_flows_again_once_assigned_back(
    tansu: Tansu, rel: Reliability, topic: str, group: str, db_offsets: bool
) -> None:
    """A member holds a record (blocking retry: its partition paused) when another member joins the group and
    leaves again. The partition comes back to it: the held record is applied and later records still flow —
    librdkafka keeps a pause across the revoke and the new assignment, so a member that forgot its holds at
    the revoke would never have consumed that partition again."""
    policy = RetryPolicy(delays_s=(3.0, 3.0), mode=RetryMode.BLOCKING)
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    failed: list[str] = []

    def handler(env: Envelope, session: Session) -> None:
        if env.message_id == "m1" and not failed:
            failed.append("m1")
            raise RuntimeError("first try of m1 fails")
        apply_effect(group)(env, session)

    handle = idempotent_consumer(rel, group=group)(handler)
    produce(tansu.bootstrap, topic, with_ids(["m1"]))
    other_topic = f"{topic}-other"
    ensure_topics(tansu.bootstrap, [other_topic])
    offsets = {"db_offsets": True, "rel": rel} if db_offsets else {}
    with make_consumer(tansu.bootstrap, topic, group, handle, retry=policy, **offsets) as first:
        assert first.run(until=lambda: first.counts["held"] >= 1, timeout_s=TIMEOUT_S)
        assert first.assigned  # the held partition is paused now

        def join_and_leave() -> None:  # a second member of the group: a rebalance in, another out
            with make_consumer(tansu.bootstrap, other_topic, group, handle, retry=RetryPolicy(())) as second:
                second.run(timeout_s=5)

        member = threading.Thread(target=join_and_leave)
        member.start()
        try:
            applied = first.run(until=lambda: effect_counts(rel.engine, group).get("m1") == 1, timeout_s=40)
        finally:
            member.join()
        assert applied, f"held record never applied after the rebalance (counts {dict(first.counts)})"
        produce(tansu.bootstrap, topic, with_ids(["m2"]))  # the same, only partition
        assert first.run(until=lambda: effect_counts(rel.engine, group).get("m2") == 1, timeout_s=TIMEOUT_S)
    assert effect_counts(rel.engine, group) == {"m1": 1, "m2": 1}


def test_a_group_leaves_another_groups_retry_copies_alone_on_unscoped_retry_topics(
    tansu: Tansu, rel: Reliability, topic: str, group: str
) -> None:
    """Two groups on one topic with the default, unscoped retry topics: both read ``{topic}.retry.1``. The
    copy billing forwarded after its handler failed is billing's business: audit, which has the message from
    the topic itself, commits past it without handling it — no duplicate delivery in its journal, and no
    "retries exhausted" of its own when its handler would fail on billing's last copy."""
    policy = RetryPolicy(delays_s=(0.3,))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    billing, audit = f"{group}-billing", f"{group}-audit"
    calls: dict[str, list[str]] = {billing: [], audit: []}

    def handler_of(name: str) -> Any:
        def handler(env: Envelope, session: Session) -> None:
            calls[name].append(env.source_topic)
            if name == billing and env.reconsume_times == 0:
                raise RuntimeError("billing's first try fails")
            apply_effect(name)(env, session)

        return idempotent_consumer(rel, group=name)(handler)

    produce(tansu.bootstrap, topic, with_ids(["m1"]))
    with make_consumer(tansu.bootstrap, topic, billing, handler_of(billing), retry=policy) as first:
        assert first.run(until=lambda: first.counts["success"] >= 1, timeout_s=TIMEOUT_S)
    (copy,) = read_all(tansu.bootstrap, f"{topic}.retry.1", expect=1)
    assert headers_of(copy)[C.KAFKA_HEADER_RETRY_GROUP] == billing
    with make_consumer(tansu.bootstrap, topic, audit, handler_of(audit), retry=policy) as second:
        assert second.run(
            until=lambda: second.counts["success"] >= 1 and second.counts["foreign_retry"] >= 1,
            timeout_s=TIMEOUT_S,
        )
        assert second.counts["duplicate"] == 0
    assert calls == {billing: [topic, f"{topic}.retry.1"], audit: [topic]}
    assert [m for m, _, _ in log_rows(rel.engine, audit)] == ["m1"]  # one delivery: the topic's
    assert committed(tansu.bootstrap, audit, f"{topic}.retry.1", 1) == [1]  # committed past, unhandled
    assert effect_counts(rel.engine, billing) == {"m1": 1} and effect_counts(rel.engine, audit) == {"m1": 1}
