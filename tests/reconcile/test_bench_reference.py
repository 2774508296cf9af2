"""The benchmark's DuckDB reference (bench/reconcile_duckdb.py) on the planted dataset: its percentiles are
the exact nearest-rank ones, so the benchmark's comparison of the two engines is against a true value.

``approx_quantile`` (a t-digest) interpolated between the few samples of a small input and gave values no
pair had; ``quantile_disc`` is the ``ceil(p·n)``-th smallest, as :func:`exact_percentiles` computes it.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import pytest

from tests.reconcile import dataset as D
from tests.reconcile.conftest import write_parquet


def test_reference_percentiles_are_the_exact_nearest_rank_ones(tmp_path: Path) -> None:
    """Forty pairs with forty different latencies: few enough that a sketch interpolates visibly."""
    pytest.importorskip("duckdb")
    from bench import reconcile_duckdb as ref

    ds = D.Dataset()
    for i in range(40):
        mid = f"m{i}"
        created = ds.stub(mid, 0, i, created=D.ago(100) + dt.timedelta(seconds=i))
        ds.row(D.A, mid, "CONFIRMED", created)
        ds.inbox[-1]["confirmed_at"] = created + dt.timedelta(milliseconds=1000 + 37 * i * i)
        ds.log(D.A, mid, 0, i, created + dt.timedelta(milliseconds=5 + 11 * i * i))
    ds.finish_progress()
    src = write_parquet(ds, tmp_path / "in")
    report = ref.reference_report(src, tmp_path / "out", D.AS_OF, grace_s=300, stuck_after_s=900)
    assert report["percentiles_ms"] == ref.exact_percentiles(src)


def test_reference_names_the_same_duplicate_causes_as_planted(planted: D.Dataset, tmp_path: Path) -> None:
    """The benchmark checks that both engines agree; both must agree with the planted truth too (an original
    overtaken by its targeted resend is the resend's duplicate in either engine)."""
    pytest.importorskip("duckdb")
    from bench import reconcile_duckdb as ref

    src = write_parquet(planted, tmp_path / "in")
    report = ref.reference_report(src, tmp_path / "out", D.AS_OF, grace_s=300, stuck_after_s=900)
    want = Counter(cause for _, _, cause in D.EXPECTED["duplicates"])
    assert report["duplicates_by_cause"] == {c: want[c] for c in ref.CAUSES}


def test_reference_finds_the_planted_stuck_pairs(planted: D.Dataset, tmp_path: Path) -> None:
    """The benchmark compares the two engines' stuck counts: the reference, too, holds a pair waiting for the
    broker's redelivery (RETRY-WAIT) and flags the overdue one (RETRY-DUE), by the sweeper's schedule."""
    pytest.importorskip("duckdb")
    from bench import reconcile_duckdb as ref

    src = write_parquet(planted, tmp_path / "in")
    report = ref.reference_report(src, tmp_path / "out", D.AS_OF, grace_s=300, stuck_after_s=900)
    want = Counter(group for group, _ in D.EXPECTED["stuck"])
    assert {g: figures["stuck"] for g, figures in report["groups"].items() if figures["stuck"]} == want
