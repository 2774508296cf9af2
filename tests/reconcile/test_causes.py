"""The duplicates' causes where a targeted resend lands on the message's own topic (RabbitMQ: the group's
queue; Kafka and RocketMQ 5.x: the shared topic), beside RocketMQ's ``%RETRY%{group}`` resends and a true
producer double-send.

What a user needs: a duplicate made by the sweeper's resend is named ``targeted_resend``, not
``producer_double_send`` — the latter sends the team hunting a producer bug that does not exist. Until
2026-11-29 the report recognised a resend only by its ``%RETRY%`` topic. Both engines (the Spark job and the
benchmark's DuckDB reference) must name the same causes.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.reconcile import dataset as D
from tests.reconcile.conftest import run_report, write_parquet

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

#: RabbitMQ positions: queue 0, the sender's microsecond clock as the offset
SEQ = 1_795_000_000_000_000
TP, TR = "producer_double_send", "targeted_resend"


def _dataset() -> tuple[D.Dataset, list[tuple[str, str, str]]]:
    """Planted messages and the (group, message_id, cause) of every extra delivery, by hand."""
    ds = D.Dataset()
    want: list[tuple[str, str, str]] = []

    def confirmed(mid: str, queue: int, offset: int, groups: tuple[str, ...], **stub: Any) -> dt.datetime:
        created = ds.stub(mid, queue, offset, **stub)
        for g in groups:
            ds.row(g, mid, "CONFIRMED", created)
        return created

    # RabbitMQ: billing's copy was late; the sweeper re-sent it to billing's queue (a new sequence number on
    # the message's own topic), then the original arrived too. audit got the original once.
    created = confirmed("RMQ-LATE", 0, SEQ, (D.B,))
    ds.row(D.A, "RMQ-LATE", "CONFIRMED", created, resend_count=1, resend_at=(0, SEQ + 10))
    for g in (D.A, D.B):
        ds.log(g, "RMQ-LATE", 0, SEQ, D.ago(119))
    ds.log(D.A, "RMQ-LATE", 0, SEQ + 10, D.ago(100))
    want.append((D.A, "RMQ-LATE", TR))
    # the same, the other way round: the resend overtook the original
    created = confirmed("RMQ-OVERTAKEN", 0, SEQ + 20, ())
    ds.row(D.A, "RMQ-OVERTAKEN", "CONFIRMED", created, resend_count=1, resend_at=(0, SEQ + 30))
    ds.log(D.A, "RMQ-OVERTAKEN", 0, SEQ + 30, D.ago(100))
    ds.log(D.A, "RMQ-OVERTAKEN", 0, SEQ + 20, D.ago(99))
    want.append((D.A, "RMQ-OVERTAKEN", TR))
    # two resends: the inbox keeps only the last position (SEQ+50); the first (SEQ+45) is no producer copy —
    # the producer sent once — so it is the earlier resend
    created = confirmed("RMQ-TWICE", 0, SEQ + 40, ())
    ds.row(D.A, "RMQ-TWICE", "CONFIRMED", created, resend_count=2, resend_at=(0, SEQ + 50))
    for at, offset in ((110, SEQ + 40), (100, SEQ + 45), (90, SEQ + 50)):
        ds.log(D.A, "RMQ-TWICE", 0, offset, D.ago(at))
    want += [(D.A, "RMQ-TWICE", TR)] * 2
    # Kafka / RocketMQ 5.x: the resend for audit went to the shared topic, so billing got it too
    created = confirmed("SHARED-1", 1, 5, (D.A,))
    ds.row(D.B, "SHARED-1", "CONFIRMED", created, resend_count=1, resend_at=(1, 20))
    ds.log(D.A, "SHARED-1", 1, 5, D.ago(119))
    ds.log(D.A, "SHARED-1", 1, 20, D.ago(100))
    ds.log(D.B, "SHARED-1", 1, 20, D.ago(100))
    want.append((D.A, "SHARED-1", TR))
    # the same, recorded with its topic (migration 0011)
    created = confirmed("SHARED-2", 1, 5, (D.A,))
    ds.row(D.B, "SHARED-2", "CONFIRMED", created, resend_count=1, resend_at=(1, 21), resend_topic=D.T1)
    ds.log(D.A, "SHARED-2", 1, 5, D.ago(119))
    ds.log(D.A, "SHARED-2", 1, 21, D.ago(100))
    ds.log(D.B, "SHARED-2", 1, 21, D.ago(100))
    want.append((D.A, "SHARED-2", TR))
    # RocketMQ 4.x: the resend came through %RETRY%search
    created = confirmed("RETRY-TOPIC-1", 1, 6, ())
    ds.row(D.C, "RETRY-TOPIC-1", "CONFIRMED", created, resend_count=1, resend_at=(0, 0))
    ds.log(D.C, "RETRY-TOPIC-1", 1, 6, D.ago(119))
    ds.log(D.C, "RETRY-TOPIC-1", 0, 0, D.ago(100), topic=D.retry(D.C), original=D.T1)
    want.append((D.C, "RETRY-TOPIC-1", TR))
    # a true producer double-send: two topic-wide sends (the first's ACK lost), no targeted resend
    confirmed("DOUBLE-1", 1, 8, (D.A, D.B), send_count=2)
    for g in (D.A, D.B):
        ds.log(g, "DOUBLE-1", 1, 7, D.ago(119))
        ds.log(g, "DOUBLE-1", 1, 8, D.ago(118))
        want.append((g, "DOUBLE-1", TP))
    # one resend, recorded and not delivered yet; a second copy at a third position: not that resend (its
    # position is known) — a copy the producer's client stored twice
    created = confirmed("DOUBLE-2", 1, 9, ())
    ds.row(D.A, "DOUBLE-2", "CONFIRMED", created, resend_count=1, resend_at=(1, 30))
    ds.log(D.A, "DOUBLE-2", 1, 9, D.ago(119))
    ds.log(D.A, "DOUBLE-2", 1, 10, D.ago(118))
    want.append((D.A, "DOUBLE-2", TP))
    # a producer double-send whose second copy has the very numbers (queue 1, offset 12) of search's resend in
    # %RETRY%search: the row records that topic, so the copy on orders is no resend (until 2026-11-29 it was)
    created = confirmed("SAME-NUMBERS", 1, 12, (D.A,), send_count=2)
    ds.row(
        D.C,
        "SAME-NUMBERS",
        "CONFIRMED",
        created,
        resend_count=1,
        resend_at=(1, 12),
        resend_topic=D.retry(D.C),
    )
    ds.log(D.A, "SAME-NUMBERS", 1, 11, D.ago(119))
    ds.log(D.A, "SAME-NUMBERS", 1, 12, D.ago(118))
    want.append((D.A, "SAME-NUMBERS", TP))
    ds.finish_progress()
    return ds, sorted(want)


def test_resends_on_the_messages_own_topic_are_not_producer_double_sends(spark: Any, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig

    ds, want = _dataset()
    src = write_parquet(ds, tmp_path / "in")
    cfg = ReconcileConfig(as_of=D.AS_OF)
    summary = run_report(spark, io.read_parquet(spark, src, cfg), tmp_path / "out", cfg).summary
    rows = pq.read_table(tmp_path / "out" / "duplicates.parquet").to_pylist()
    assert sorted((r["consumer_group"], r["message_id"], r["cause"]) for r in rows) == want
    counts = Counter(cause for _, _, cause in want)
    assert summary["duplicates_by_cause"] == {
        "redelivery": 0, "retry": 0, "producer_double_send": counts[TP], "targeted_resend": counts[TR],
    }  # fmt: skip


def test_the_benchmark_reference_names_the_same_causes(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    from bench import reconcile_duckdb as ref

    ds, want = _dataset()
    src = write_parquet(ds, tmp_path / "in")
    report = ref.reference_report(src, tmp_path / "out", D.AS_OF, grace_s=300, stuck_after_s=900)
    counts = Counter(cause for _, _, cause in want)
    assert report["duplicates_by_cause"] == {c: counts[c] for c in ref.CAUSES}
