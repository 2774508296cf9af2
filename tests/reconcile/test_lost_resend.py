"""A targeted resend on the message's own topic that never arrived is reported *lost*.

What a user needs: on RabbitMQ, Kafka and RocketMQ 5.x the sweeper's resend lands on the message's own topic
(the group's queue, the shared topic), not in ``%RETRY%{group}``. When the group's position on that queue
passes the resend's offset and no delivery of it was journaled, the copy is gone: ``--max-lost 0`` must
alarm. Until migration 0011 the inbox row kept the resend's position but not its topic, the report assumed
``%RETRY%{group}`` and never found it. Rows recorded before (no topic) and exports made before (no column)
are read as they were. Both engines (the Spark job and the benchmark's DuckDB reference) must agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.reconcile import dataset as D
from tests.reconcile.conftest import run_report, write_parquet

#: the pairs lost with the resend's topic recorded, and as an export from before migration 0011 reads
LOST = [(D.B, "OWN-TOPIC-LOST"), (D.B, "RETRY-TOPIC-LOST")]
LOST_BEFORE_0011 = [(D.B, "RETRY-TOPIC-LOST")]


def _dataset() -> D.Dataset:
    """audit's position on ``orders`` queue 1 is 50, on ``%RETRY%audit`` queue 0 it is 5."""
    ds = D.Dataset()
    for mid, offset, topic, queue in (("NEXT-1", 50, D.T1, 1), ("NEXT-RETRY", 5, D.retry(D.B), 0)):
        created = ds.stub(mid, 1, offset if topic == D.T1 else 30)
        ds.row(D.B, mid, "CONFIRMED", created)
        ds.log(D.B, mid, queue, offset, D.ago(100), topic=topic, original=D.T1)

    def owed(mid: str, at: tuple[int, int], topic: str | None) -> None:
        created = ds.stub(mid, 1, 11, status="PENDING")
        ds.row(D.B, mid, "PENDING", created, resend_count=1, resend_at=at, resend_topic=topic)

    # resent to audit on the topic itself (RabbitMQ, Kafka, RocketMQ 5.x) at 40; audit is at 50, never got it
    owed("OWN-TOPIC-LOST", (1, 40), D.T1)
    # decoy: the same resend beyond audit's position is queued, not lost
    owed("OWN-TOPIC-QUEUED", (1, 60), D.T1)
    # resent into %RETRY%audit (RocketMQ 4.x, broker_sim) at 3; audit is at 5 there
    owed("RETRY-TOPIC-LOST", (0, 3), D.retry(D.B))
    # recorded before migration 0011: no topic, read as %RETRY%audit queue 1 (no position there) — as before
    owed("UNRECORDED-TOPIC", (1, 41), None)
    for row in (*ds.stubs, *ds.inbox, *ds.logs):  # as an export has it (NOT NULL DEFAULT '', migration 0006)
        row["broker_name"] = ""
    ds.finish_progress()
    return ds


def _drop_resend_topic(src: Path, dst: Path) -> Path:
    """The same export as one made before migration 0011: no ``resend_topic`` column."""
    import shutil

    import pyarrow.parquet as pq

    shutil.copytree(src, dst)
    inbox = pq.read_table(src / "message_inbox.parquet")
    pq.write_table(inbox.drop(["resend_topic"]), dst / "message_inbox.parquet")
    return dst


def _pairs(path: Path) -> list[tuple[str, str]]:
    import pyarrow.parquet as pq

    return sorted((r["consumer_group"], r["message_id"]) for r in pq.read_table(path).to_pylist())


def test_the_benchmark_reference_finds_a_lost_resend_on_the_messages_own_topic(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    from bench import reconcile_duckdb as ref

    src = write_parquet(_dataset(), tmp_path / "in")
    for source, out, want in (
        (src, tmp_path / "out", LOST),
        (_drop_resend_topic(src, tmp_path / "in-0010"), tmp_path / "out-0010", LOST_BEFORE_0011),
    ):
        report = ref.reference_report(source, out, D.AS_OF, grace_s=300, stuck_after_s=900)
        assert report["totals"]["lost"] == len(want)
        assert _pairs(out / "lost.parquet") == want


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_job_finds_a_lost_resend_on_the_messages_own_topic(spark: Any, tmp_path: Path) -> None:
    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig

    cfg = ReconcileConfig(as_of=D.AS_OF)
    src = write_parquet(_dataset(), tmp_path / "in")
    summary = run_report(spark, io.read_parquet(spark, src, cfg), tmp_path / "out", cfg).summary
    assert summary["totals"]["lost"] == len(LOST)
    assert _pairs(tmp_path / "out" / "lost.parquet") == LOST
    lost = {(r["message_id"], r["send_topic"]) for r in _rows(tmp_path / "out" / "lost.parquet")}
    assert lost == {("OWN-TOPIC-LOST", D.T1), ("RETRY-TOPIC-LOST", D.retry(D.B))}
    # an export from before migration 0011 reads with no topic recorded (no report run: only the input)
    old = io.read_parquet(spark, _drop_resend_topic(src, tmp_path / "in-0010"), cfg)
    assert {r["resend_topic"] for r in old.inbox.select("resend_topic").collect()} == {None}


def _rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows
