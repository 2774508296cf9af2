"""A batch reads each queue's watermark once: what triage read serves the resends' backlog estimate."""

from __future__ import annotations

from reliable import Reliability
from reliable.sweeper.queues import QueueIdKey, Watermarks
from tests.sweeper.helpers import set_progress


def _load(rel: Reliability, marks: Watermarks, queue_ids: set[int]) -> dict[int, int]:
    keys: set[QueueIdKey] = {("billing", "orders", q) for q in queue_ids}
    with rel.engine.connect() as conn:
        return {k[3]: v.max_offset for k, v in marks.load(conn, keys).items()}


def test_a_batch_reads_each_queues_watermark_once_and_keeps_every_one_it_read(rel: Reliability) -> None:
    set_progress(rel, 5, queue_id=0)
    marks = Watermarks()
    assert _load(rel, marks, {0, 1}) == {0: 5}
    set_progress(rel, 9, queue_id=0)
    set_progress(rel, 3, queue_id=1)
    set_progress(rel, 7, queue_id=2)
    # queues 0 and 1 were read for this batch (1 had no row then); only queue 2 is new
    assert _load(rel, marks, {1, 2}) == {0: 5, 2: 7}
    assert _load(rel, Watermarks(), {0, 1}) == {0: 9, 1: 3}  # the next batch reads afresh
