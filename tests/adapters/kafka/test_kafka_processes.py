"""Consumer processes killed mid-batch (live Tansu, PostgreSQL, Redis): a second member of the group takes
over, or a restarted one resumes from the offsets kept in the database; nothing is lost or applied twice."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from reliable import Reliability
from reliable.adapters.kafka import RetryPolicy, ensure_topics
from reliable.adapters.kafka_offsets import load
from reliable.demo.tansu import Tansu
from tests.adapters.kafka.conftest import Workers
from tests.adapters.kafka.helpers import TIMEOUT_S, committed, effect_counts, produce, with_ids, worker_status
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
PARTITIONS = 4


@pytest.mark.parametrize("batch", [1, 0], ids=["batch", "per-record"])
def test_a_member_killed_mid_batch_loses_nothing_and_applies_nothing_twice(
    batch: int,
    tansu: Tansu,
    rel: Reliability,
    postgres_url: str,
    redis_url: str,
    key_prefix: str,
    topic: str,
    group: str,
    workers: Workers,
) -> None:
    ensure_topics(tansu.bootstrap, RetryPolicy(delays_s=(0.3,)).all_topics(topic), partitions=PARTITIONS)
    common = dict(
        batch=batch,
        bootstrap=tansu.bootstrap,
        topic=topic,
        group=group,
        db=postgres_url,
        redis=redis_url,
        prefix=key_prefix,
    )
    victim, victim_status = workers("victim", die_after=5, **common)
    survivor, survivor_status = workers("survivor", **common)
    # both members hold a share of the partitions before any record exists
    wait_until(
        lambda: (
            len(worker_status(victim_status)["assigned"])
            == len(worker_status(survivor_status)["assigned"])
            == PARTITIONS // 2
        ),
        TIMEOUT_S,
        "a balanced group",
    )
    ids = [f"m{i:03d}" for i in range(80)]
    produce(tansu.bootstrap, topic, with_ids(ids))
    assert victim.wait(TIMEOUT_S) == -signal.SIGKILL
    wait_until(lambda: set(effect_counts(rel.engine, group)) == set(ids), 45, "every record applied")
    wait_until(
        lambda: sum(committed(tansu.bootstrap, group, topic, PARTITIONS)) == len(ids),
        20,
        "the survivor to commit every partition",
    )
    counts = effect_counts(rel.engine, group)
    assert counts == {i: 1 for i in ids}
    assert survivor.poll() is None  # the survivor lived through it; a clean stop flushes its journal
    os.kill(survivor.pid, signal.SIGTERM)
    assert survivor.wait(20) == 0
    journal = journal_by_worker(rel)
    victim_tag, survivor_tag = f":{victim.pid}:", f":{survivor.pid}:"
    applied_by_victim = {m for m, o, w in journal if o == "SUCCESS" and victim_tag in w}
    duplicates = [(m, w) for m, o, w in journal if o == "DUPLICATE"]
    # the victim's last batch was applied but its offsets never committed: the survivor got those records
    # again, and the guard suppressed them; the journal shows who applied and who was refused
    assert len(applied_by_victim) >= 5
    assert duplicates, "the killed member's uncommitted records were not redelivered"
    assert all(survivor_tag in w and m in applied_by_victim for m, w in duplicates)


@pytest.mark.parametrize("batch", [1, 0], ids=["batch", "per-record"])
def test_a_failed_record_is_retried_after_a_crash_with_database_offsets(
    batch: int,
    tansu: Tansu,
    rel: Reliability,
    postgres_url: str,
    redis_url: str,
    key_prefix: str,
    topic: str,
    group: str,
    workers: Workers,
) -> None:
    """``db_offsets`` with ``offsets_in_db``: m002 fails, m003 succeeds, and the member is killed before
    m002's retry copy has landed. A later record's transaction must not have stored the position past m002:
    the restarted member starts at m002 and applies it. Until 2026-11-28 m003 (in batch mode every record of
    the chunk) stored its own next offset, the restarted member started after m002, and m002 was never
    retried in this group."""
    ensure_topics(tansu.bootstrap, RetryPolicy(delays_s=(0.3,)).all_topics(topic), partitions=1)
    ids = [f"m{i:03d}" for i in range(6)]
    produce(tansu.bootstrap, topic, with_ids(ids))
    common = dict(
        batch=batch,
        db_offsets=1,
        bootstrap=tansu.bootstrap,
        topic=topic,
        group=group,
        db=postgres_url,
        redis=redis_url,
        prefix=key_prefix,
    )
    # the third success is m003; no copy of m002 can land (its producer has no broker)
    victim, _ = workers("victim", die_after=3, fail_first="m002", dead_forwarder=1, **common)
    assert victim.wait(TIMEOUT_S) == -signal.SIGKILL
    assert "m002" not in effect_counts(rel.engine, group) and "m003" in effect_counts(rel.engine, group)
    assert load(rel.engine, group, [topic]).get((topic, 0), 0) <= 2  # nothing stored past the failed record
    restarted, _ = workers("restarted", **common)
    wait_until(lambda: set(effect_counts(rel.engine, group)) == set(ids), 45, "every record applied")
    wait_until(lambda: load(rel.engine, group, [topic]) == {(topic, 0): 6}, 20, "the position past them all")
    assert effect_counts(rel.engine, group) == {i: 1 for i in ids}
    os.kill(restarted.pid, signal.SIGTERM)
    assert restarted.wait(20) == 0


def journal_by_worker(rel: Reliability) -> list[tuple[str, str, str]]:
    from sqlalchemy import select

    from reliable.models import MessageLog

    with rel.engine.connect() as conn:
        rows = conn.execute(
            select(MessageLog.message_id, MessageLog.outcome, MessageLog.worker).order_by(MessageLog.id)
        )
        return [(m, str(o), w or "") for m, o, w in rows]
