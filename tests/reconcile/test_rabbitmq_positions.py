"""RabbitMQ and RocketMQ topics in one database: offset gaps and lag only where positions are offsets.

A RabbitMQ queue has no offsets; the RabbitMQ senders stamp their clock (µs since the epoch) as the position
and the consumer journals it as ``queue_offset``. Consecutive RabbitMQ messages are thousands of "offsets"
apart, so until this was fixed every RabbitMQ queue showed a gap between every two deliveries and a lag of
about a day's microseconds, ``--max-gaps`` fired on every RabbitMQ topic, and a team with RocketMQ and
RabbitMQ in one database could alert on neither gaps nor lag. What a user needs: no gaps and no lag for a
RabbitMQ queue (``n/a`` on the page), the RocketMQ hole still found and alerted on, and *lost* — which does
mean something on RabbitMQ (the group's position passed a message it never received) — still reported.

The RabbitMQ rows are the ones the adapter writes: positions from its own envelope mapping of a delivery
carrying the sender's ``x-reliable-seq`` (the sender's clock at the send, as ``next_seq`` gives it).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from reliable import constants as C
from reliable.adapters import amqp
from tests.reconcile import dataset as D
from tests.reconcile.conftest import write_parquet

RABBIT = "shipments"
#: the RabbitMQ messages audit never received (the broker dropped them: x-max-length, drop-head)
DROPPED = {2, 3, 4}
#: search is behind: it has received the first five RabbitMQ messages, the rest are queued (not lost)
RECEIVED_BY_SEARCH = 5


def _sent_at_position(sent: dt.datetime) -> tuple[int, int]:
    """(queue_id, queue_offset) the RabbitMQ consumer journals for a message sent at ``sent``: the adapter's
    envelope of a delivery carrying the sender's clock then (what ``next_seq`` returns at that instant)."""
    seq = int(sent.timestamp()) * 1_000_000 + sent.microsecond
    env = amqp.envelope_from(
        message_id="x",
        headers={amqp.HEADER_SEQ: seq, amqp.HEADER_TOPIC: RABBIT},
        exchange="",
        routing_key=f"{RABBIT}.{D.A}",
        redelivered=False,
        delivery_tag=1,
        type_=None,
        body=b"{}",
    )
    return env.queue_id, env.queue_offset


def mixed() -> D.Dataset:
    """Eight RabbitMQ messages seconds apart (billing gets all, audit loses three, search is behind by
    three) and five RocketMQ ones on queue 0 of ``orders`` (billing misses offset 2: one real gap and one
    lost pair; audit gets all)."""
    ds = D.Dataset()
    for i in range(8):
        mid = f"rabbit-{i}"
        created = D.ago(100) + dt.timedelta(seconds=7 * i, microseconds=137 * i)
        queue, offset = _sent_at_position(created)
        ds.stub(mid, queue, offset, topic=RABBIT, created=created, status="PENDING")
        for group in D.ALL:
            if (group == D.B and i in DROPPED) or (group == D.C and i >= RECEIVED_BY_SEARCH):
                ds.row(group, mid, "PENDING", created)
                continue
            ds.row(group, mid, "CONFIRMED", created)
            ds.log(group, mid, queue, offset, created + dt.timedelta(milliseconds=40), topic=RABBIT)
    for offset in range(5):
        D.normal(
            ds,
            f"rocket-{offset}",
            0,
            offset,
            groups=(D.B,) if offset == 2 else (D.A, D.B),
            pending=(D.A,) if offset == 2 else (),
        )
    for row in (*ds.stubs, *ds.inbox, *ds.logs):  # no broker groups: what both adapters write
        row["broker_name"] = ""
    ds.finish_progress()
    return ds


def _queue(summary: dict[str, Any], group: str, topic: str) -> dict[str, Any]:
    return next(q for q in summary["queues"] if (q["consumer_group"], q["topic"]) == (group, topic))


def test_the_adapter_positions_are_clock_positions() -> None:
    """The marker the report reads: every RabbitMQ send position is at or above AMQP_CLOCK_POSITION_MIN,
    and the consumer journals it unchanged (no broker offset comes near it)."""
    seq = amqp.next_seq()
    assert seq >= C.AMQP_CLOCK_POSITION_MIN
    assert amqp.position(seq, 7) == seq


@pytest.fixture(scope="module")
def report(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from reliable.reconcile import io
    from reliable.reconcile.config import ReconcileConfig, Thresholds
    from reliable.reconcile.runner import reconcile

    cfg = ReconcileConfig(as_of=D.AS_OF)
    src = write_parquet(mixed(), tmp_path_factory.mktemp("rabbit-in"))
    out = tmp_path_factory.mktemp("rabbit-out")
    thresholds = Thresholds(max_gaps=1, max_lag=0, max_lost=4)
    return reconcile(spark, io.read_parquet(spark, src, cfg), out, cfg, thresholds, source="test"), src


def test_rabbitmq_queues_have_no_gaps_and_no_lag(report: Any) -> None:
    result, _ = report
    s = result.summary
    for group in D.ALL:
        q = _queue(s, group, RABBIT)
        assert (q["offsets"], q["gaps"], q["missing_offsets"], q["lag"]) == (False, 0, 0, 0), q
    for group in (D.A, D.B):
        assert _queue(s, group, D.T1)["offsets"] is True
    assert (s["totals"]["gaps"], s["totals"]["missing_offsets"], s["totals"]["lag"]) == (1, 1, 0)
    billing = _queue(s, D.A, D.T1)
    assert (billing["gaps"], billing["missing_offsets"]) == (1, 1)


def test_the_thresholds_alert_on_the_rocketmq_gap_only(report: Any) -> None:
    """--max-gaps 1 and --max-lag 0 hold: the one RocketMQ hole is within the limit, and RabbitMQ adds
    neither gaps nor a lag of microseconds for the group that is behind."""
    result, _ = report
    assert result.summary["breaches"] == []
    assert result.ok


def test_rabbitmq_loss_is_still_reported(report: Any) -> None:
    """What means something on RabbitMQ stays: audit's position passed the three dropped messages."""
    result, _ = report
    s = result.summary
    assert _queue(s, D.B, RABBIT)["lost"] == len(DROPPED)
    assert s["totals"]["lost"] == len(DROPPED) + 1
    lost = {(p["consumer_group"], p["message_id"]) for p in s["attention"]["lost"]["pairs"]}
    assert lost == {(D.B, f"rabbit-{i}") for i in DROPPED} | {(D.A, "rocket-2")}
    assert _queue(s, D.A, RABBIT)["latency_ms"]["send_to_first_delivery"]["count"] == 8


def test_the_page_says_n_a_for_rabbitmq_lag_and_gaps(report: Any) -> None:
    result, _ = report
    html = (Path(result.out_dir) / "report.html").read_text(encoding="utf-8")
    row = next(r for r in html.split("<tr>") if f">{D.B}</td>" in r and f">{RABBIT}</td>" in r)
    assert 'data-col="lag">n/a</td>' in row and 'data-col="gaps">n/a</td>' in row
    rocket = next(r for r in html.split("<tr>") if f">{D.A}</td>" in r and f">{D.T1}</td>" in r)
    assert 'data-col="gaps">1</td>' in rocket


def test_the_duckdb_reference_agrees(report: Any, tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    from bench import reconcile_duckdb as ref

    result, src = report
    want = ref.reference_report(src, tmp_path / "out", D.AS_OF, grace_s=300, stuck_after_s=900)
    got = ref.spark_view(result.summary)
    assert got["totals"] == {k: v for k, v in want["totals"].items() if k in got["totals"]}
    assert got["groups"] == want["groups"]
    assert (want["totals"]["gaps"], want["totals"]["lag"]) == (1, 0)
