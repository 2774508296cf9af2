"""Offset gaps from per-block bitmasks must equal the plain definition: holes between consecutive distinct
offsets of each delivered queue (Spark, local[2]).

The reference here is that definition in plain Python. The cases are the ones the bitmask arithmetic can get
wrong: a hole at a block edge (offsets 63/64, 127/128), a run filling a whole block (bit 63 is the sign
bit), several holes inside one block, a queue whose first offset is not 0 (no hole before it), duplicate
offsets, several broker groups with the same queue id, a queue with one offset, null offsets, a jump of a
billion offsets, and a seeded random mix.
"""

from __future__ import annotations

import datetime as dt
import itertools
import random
from typing import Any

import pytest

from reliable.reconcile.config import ReconcileConfig

T0 = dt.datetime(2026, 11, 20, 11, 30, tzinfo=dt.UTC)
Queue = tuple[str, str, str, int]
Gap = tuple[str, str, str, int, int, int, int]


def reference(rows: list[tuple[Queue, int | None]]) -> list[Gap]:
    offsets: dict[Queue, set[int]] = {}
    for queue, offset in rows:
        if offset is not None:
            offsets.setdefault(queue, set()).add(offset)
    gaps: list[Gap] = []
    for queue, held in offsets.items():
        ordered = sorted(held)
        for prev, cur in itertools.pairwise(ordered):
            if cur - prev > 1:
                gaps.append((*queue, prev + 1, cur - 1, cur - prev - 1))
    return sorted(gaps)


def cases() -> list[tuple[Queue, int | None]]:
    rows: list[tuple[Queue, int | None]] = []

    def add(queue: Queue, offsets: list[int | None]) -> None:
        rows.extend((queue, o) for o in offsets)

    add(("billing", "orders", "", 0), [*range(0, 63), *range(64, 127), *range(129, 300)])  # block edges
    add(("billing", "orders", "", 1), [*range(0, 64), *range(64, 128), 128])  # full blocks, no gap
    add(("billing", "orders", "", 2), [5, 7, 9, 10, 20, 40, 41, 62])  # several holes in one block
    add(("billing", "orders", "", 3), [1000, 1001, 1001, 1003, 1003, 1003])  # starts late, duplicates
    add(("billing", "orders", "broker-a", 0), [0, 2, 4])  # same queue id, two broker groups
    add(("billing", "orders", "broker-b", 0), [0, 1, 2, 3, 9])
    add(("audit", "orders", "broker-a", 0), [1, 3])  # same queue, another group
    add(("audit", "orders", "", 4), [42])  # one offset: no gap
    add(("audit", "orders", "", 5), [None, 3, None, 6])  # null offsets are no positions
    add(("audit", "orders", "", 6), [0, 63, 200])  # a block's lowest and highest bit only
    add(("audit", "%RETRY%audit", "", 0), [0, 1, 1_000_000_000, 1_000_000_001, 1_000_000_063])
    rnd = random.Random(18)
    for q in range(3):
        add(("search", "payments", "", q), [rnd.randrange(0, 700) for _ in range(500)])
    return rows


@pytest.mark.spark
@pytest.mark.slow
def test_gaps_equal_the_holes_between_consecutive_distinct_offsets(spark: Any) -> None:
    from reliable.reconcile.gaps import GAP_COLUMNS, offset_gaps

    rows = cases()
    logs = spark.createDataFrame(
        [
            {
                "consumer_group": q[0],
                "topic": q[1],
                "broker_name": q[2],
                "queue_id": q[3],
                "queue_offset": offset,
                "received_at": T0,
            }
            for q, offset in rows
        ],
        "consumer_group string, topic string, broker_name string, queue_id int, queue_offset long, "
        "received_at timestamp",
    )
    got = sorted(
        tuple(r) for r in offset_gaps(logs, ReconcileConfig(as_of=T0)).select(*GAP_COLUMNS).collect()
    )
    want = reference(rows)
    assert got == want
    assert ("billing", "orders", "", 0, 63, 63, 1) in got and ("billing", "orders", "", 0, 127, 128, 2) in got
    assert not [g for g in got if g[:4] == ("billing", "orders", "", 1)]


@pytest.mark.spark
@pytest.mark.slow
def test_gaps_look_only_at_deliveries_received_in_the_window(spark: Any) -> None:
    from reliable.reconcile.gaps import offset_gaps

    later = T0 + dt.timedelta(hours=2)
    logs = spark.createDataFrame(
        [("billing", "orders", "", 0, o, T0) for o in (0, 4)] + [("billing", "orders", "", 0, 2, later)],
        "consumer_group string, topic string, broker_name string, queue_id int, queue_offset long, "
        "received_at timestamp",
    )
    cfg = ReconcileConfig(as_of=later, since=T0, until=T0 + dt.timedelta(hours=1))
    assert [(r["gap_start"], r["gap_end"]) for r in offset_gaps(logs, cfg).collect()] == [(1, 3)]


@pytest.mark.spark
@pytest.mark.slow
def test_the_holes_the_log_purge_leaves_around_the_rows_it_keeps_are_no_gaps(spark: Any) -> None:
    """The purge deletes rows older than the log retention except the evidence of owed rows: a DEAD row's
    delivery at offset 3, ten days old, stayed among offsets 0–19 purged. Those offsets were received and
    confirmed, not lost: only deliveries within the retention count. Until 2026-11-28 the report counted
    4–19 as a gap (``--max-gaps`` fired) until the DEAD row was resolved; a real hole inside the
    retention is still one."""
    from reliable.reconcile.gaps import offset_gaps

    old, recent = T0 - dt.timedelta(days=10), T0 - dt.timedelta(days=1)
    rows = [("audit", "orders", "", 1, 3, old)] + [
        ("audit", "orders", "", 1, o, recent) for o in (20, 21, 25)
    ]
    logs = spark.createDataFrame(
        rows,
        "consumer_group string, topic string, broker_name string, queue_id int, queue_offset long, "
        "received_at timestamp",
    )
    week = 7 * 86400.0
    got = offset_gaps(logs, ReconcileConfig(as_of=T0, log_retention_s=week)).collect()
    assert [(r["gap_start"], r["gap_end"]) for r in got] == [(22, 24)]
    whole = offset_gaps(logs, ReconcileConfig(as_of=T0)).collect()  # no retention given: the whole log
    assert sorted((r["gap_start"], r["gap_end"]) for r in whole) == [(4, 19), (22, 24)]
