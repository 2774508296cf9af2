"""A topic whose partitions are increased while two groups consume it, end to end on Tansu, PostgreSQL, Redis.

The classic loss: records produced to a new partition before a group's consumer has joined it, with
``auto.offset.reset=latest``, are skipped by that group — the broker holds them, the group never reads them.
Tansu (0.6) has no CreatePartitions (it does not list the API and drops the request), so the change is built
as its nearest equivalent: the topic has 4 partitions from the start, the producer writes only to 0 and 1
"before the change" (keys chosen by librdkafka's partitioner, checked on every receipt), and to 2 and 3 as
well after it. Group ``fast`` reads every partition from the start; group ``slow`` reads 0 and 1, is
stopped during the change and restarts with ``latest``: it resumes 0 and 1 from its committed offsets and
starts 2 and 3 at their end, skipping what was written there meanwhile. Afterwards partition 2 keeps
getting records, partition 3 stays quiet.

What a user needs: ``fast`` applies every message once, with no false "lost" on the new partitions; ``slow``
misses the skipped ones, and the sweeper proves that loss on partition 2 with the group's position there
(past the skipped offsets, no delivery) and re-sends them, which ``slow`` applies once and ``fast``
absorbs as duplicates; on partition 3, where ``slow`` has no position, nothing proves a loss: a person is
told once (never-consumed), and not again at every round. The stop itself is a stall on 0 and 1, told
and cleared. The reconciliation report (the DuckDB reference) agrees before and after the sweeper.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from reliable import Reliability, StubProducer, idempotent_consumer
from reliable.adapters.kafka import KafkaGuardedConsumer, KafkaSender, RetryPolicy, ensure_topics
from reliable.demo.tansu import FAST_GROUP, Tansu
from reliable.models import MessageInbox
from reliable.reconcile.export import export_tables
from reliable.sweeper import Sweeper
from reliable.sweeper.notices import NoticeKind
from tests.adapters.kafka.helpers import TIMEOUT_S, apply_effect, effect_counts, log_rows
from tests.sweeper.helpers import MemoryChannel
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

PARTITIONS = 4
OLD, ACTIVE_NEW, QUIET_NEW = (0, 1), 2, 3
POLICY = RetryPolicy(delays_s=(0.3,))
#: what the classic setup has: a group joining a partition starts at its end
LATEST = {**FAST_GROUP, "auto.offset.reset": "latest"}


def _ids(prefix: str, partitions: tuple[int, ...], per_partition: int) -> dict[str, int]:
    """Message ids (= record keys) that librdkafka's default partitioner (CRC-32 of the key modulo the
    partition count) puts on each of ``partitions``, ``per_partition`` each: id → partition."""
    out: dict[str, int] = {}
    taken = dict.fromkeys(partitions, 0)
    n = 0
    while any(c < per_partition for c in taken.values()):
        mid = f"{prefix}{n:03d}"
        n += 1
        p = zlib.crc32(mid.encode()) % PARTITIONS
        if taken.get(p, per_partition) < per_partition:
            taken[p] += 1
            out[mid] = p
    return out


class Member:
    """One consumer of a group, its loop on a thread of its own."""

    def __init__(self, rel: Reliability, tansu: Tansu, topic: str, group: str) -> None:
        guard = idempotent_consumer(rel, group=group)(apply_effect(group))
        self.topic = topic
        self.consumer = KafkaGuardedConsumer(
            tansu.bootstrap, topic, group, guard, retry=POLICY, batch_size=20, config=LATEST
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.consumer.run, kwargs={"until": self.stop.is_set})
        self.thread.daemon = True
        self.thread.start()

    def holds_every_partition(self) -> bool:
        return {p for t, p in self.consumer.assigned if t == self.topic} == set(range(PARTITIONS))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(TIMEOUT_S)
        self.consumer.close()


def _inbox(rel: Reliability, group: str) -> dict[str, str]:
    stmt = select(MessageInbox.message_id, MessageInbox.status).where(MessageInbox.consumer_group == group)
    with rel.session() as s:
        return {m: str(getattr(st, "value", st)) for m, st in s.execute(stmt)}


def _on(ids: dict[str, int], partition: int) -> dict[str, int]:
    return {m: p for m, p in ids.items() if p == partition}


def _told(channel: MemoryChannel) -> set[tuple[NoticeKind, str, int | None]]:
    return {(n.kind, n.consumer_group, n.queue_id) for n in channel.notices}


def _report(rel: Reliability, tmp: Path, as_of: dt.datetime) -> dict[str, dict[str, Any]]:
    """The DuckDB reference report's per-group figures over an export of the tables."""
    pytest.importorskip("duckdb")
    from bench import reconcile_duckdb as ref

    export_tables(rel.engine, tmp / "export")
    report = ref.reference_report(tmp / "export", tmp / "report", as_of, grace_s=300, stuck_after_s=900)
    groups: dict[str, dict[str, Any]] = report["groups"]
    return groups


def test_partitions_added_while_two_groups_consume_the_skipped_records_are_resent_or_told(
    tansu: Tansu, rel: Reliability, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    topic, fast, slow = f"orders-{suffix}", f"fast-{suffix}", f"slow-{suffix}"
    ensure_topics(tansu.bootstrap, POLICY.all_topics(topic), partitions=PARTITIONS)
    before = _ids("b", OLD, 4)  # the topic "has" partitions 0 and 1
    during = _ids("d", (*OLD, ACTIVE_NEW, QUIET_NEW), 3)  # after the change, slow stopped
    after = _ids("a", (*OLD, ACTIVE_NEW), 3)  # slow back; partition 3 stays quiet
    every = {**before, **during, **after}
    away = {m for m, p in during.items() if p not in OLD}  # written to 2 and 3 while slow was away
    sender = KafkaSender(tansu.bootstrap, timeout_s=5.0)
    producer = StubProducer(rel, sender)

    def publish(batch: dict[str, int]) -> None:
        for mid, partition in batch.items():
            receipt = producer.publish(mid, topic, f"body-{mid}".encode(), groups=[fast, slow]).receipt
            assert receipt is not None and receipt.queue_id == partition, (mid, receipt)

    members = [Member(rel, tansu, topic, fast), Member(rel, tansu, topic, slow)]
    try:
        wait_until(lambda: all(m.holds_every_partition() for m in members), TIMEOUT_S, "both groups joined")
        publish(before)
        wait_until(
            lambda: (
                effect_counts(rel.engine, fast).keys()
                == effect_counts(rel.engine, slow).keys()
                == set(before)
            ),
            TIMEOUT_S,
            "both groups through the first messages",
        )
        members.pop().close()  # slow stops during the change
        publish(during)
        wait_until(
            lambda: effect_counts(rel.engine, fast).keys() == set(before) | set(during), TIMEOUT_S, "fast"
        )
        mid_change = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
        channel = MemoryChannel()
        stopped = Sweeper(rel, sender, channels=[channel], clock=lambda: mid_change).run_once()
        assert (stopped.resent, stopped.stalled) == (0, len(OLD)), stopped.line()

        during_stop = _told(channel)
        members.append(Member(rel, tansu, topic, slow))  # back, with `latest` on partitions it never read
        wait_until(members[-1].holds_every_partition, TIMEOUT_S, "slow rejoined")
        publish({m: p for m, p in after.items() if p in OLD})
        wait_until(
            lambda: effect_counts(rel.engine, slow).keys() >= set(after) - set(_on(after, ACTIVE_NEW)),
            TIMEOUT_S,
            "slow resumed",
        )
        publish(_on(after, ACTIVE_NEW))
        wait_until(
            lambda: effect_counts(rel.engine, fast).keys() == set(every), TIMEOUT_S, "fast through all"
        )
        last_on_new = max(_on(after, ACTIVE_NEW))  # ids of one partition are produced in their order
        wait_until(
            lambda: last_on_new in effect_counts(rel.engine, slow), TIMEOUT_S, "slow reading partition 2"
        )
        # the classic loss happened: slow was never given what was written to 2 and 3 while it was away (nor
        # — a race as in production — a record written to 2 just after it rejoined, before `latest` resolved)
        skipped = set(every) - effect_counts(rel.engine, slow).keys()
        assert away <= skipped <= away | set(_on(after, ACTIVE_NEW)) - {last_on_new}, sorted(skipped)
        resendable = {m for m in skipped if every[m] == ACTIVE_NEW}
        owed = skipped - resendable  # on the quiet partition: nothing proves them lost

        # the report, before the sweeper: the skipped ones on 2 are lost (slow's position passed them), the
        # quiet partition is one slow never consumed; nothing lost for fast on the new partitions
        later = mid_change + dt.timedelta(hours=1)
        seen = _report(rel, tmp_path / "before", later)
        assert (seen[fast]["lost"], seen[fast]["never_consumed_queues"], seen[fast]["pending"]) == (0, 0, 0)
        assert (seen[slow]["lost"], seen[slow]["never_consumed_queues"]) == (len(resendable), 1)
        assert seen[slow]["pending"] == len(skipped)

        first = Sweeper(rel, sender, channels=[channel], clock=lambda: later).run_once()
        assert (first.resent, first.stalled) == (len(resendable), 0), first.line()  # back: stall cleared
        wait_until(
            lambda: effect_counts(rel.engine, slow).keys() == set(every) - owed,
            TIMEOUT_S,
            "slow through the resends",
        )
        wait_until(
            lambda: {m for m, o, _ in log_rows(rel.engine, fast) if o.endswith("DUPLICATE")} == resendable,
            TIMEOUT_S,
            "fast absorbed the resends",
        )
        # past the quiet partition's hold: its rows are judged again, and not told again
        second = Sweeper(
            rel, sender, channels=[channel], clock=lambda: later + dt.timedelta(minutes=20)
        ).run_once()
        assert (second.resent, second.stalled, second.never_consumed) == (0, 0, 0), second.line()
        assert (second.selected, second.held) == (len(owed), len(owed)), second.line()  # judged again
        back = _told(channel) - during_stop
    finally:
        for m in members:
            m.close()
        sender.close()

    # exactly once per group; the quiet partition's skipped ones still owed, and told
    assert effect_counts(rel.engine, fast) == dict.fromkeys(every, 1)
    assert effect_counts(rel.engine, slow) == {m: 1 for m in every if m not in owed}
    assert _inbox(rel, fast) == dict.fromkeys(every, "CONFIRMED")
    assert _inbox(rel, slow) == {m: ("PENDING" if m in owed else "CONFIRMED") for m in every}
    # told while slow was away: it stalled on 0 and 1, and has no position on 2 and 3; once back, nothing
    # new to tell (partition 2 is consumed; 3 was told), and never fast
    never, stalled = NoticeKind.NEVER_CONSUMED, NoticeKind.STALLED
    assert during_stop == {(stalled, slow, p) for p in OLD} | {
        (never, slow, p) for p in (ACTIVE_NEW, QUIET_NEW)
    }
    assert back == set(), back

    # the report agrees
    seen = _report(rel, tmp_path / "after", later + dt.timedelta(minutes=25))
    assert (seen[fast]["confirmed"], seen[fast]["lost"], seen[fast]["never_consumed_queues"]) == (
        len(every),
        0,
        0,
    )
    assert seen[fast]["by_cause"]["targeted_resend"] == len(resendable)
    assert (seen[slow]["confirmed"], seen[slow]["pending"]) == (len(every) - len(owed), len(owed))
    assert (seen[slow]["lost"], seen[slow]["never_consumed_queues"]) == (0, 1)
