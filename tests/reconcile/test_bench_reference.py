"""The benchmark's DuckDB reference (bench/reconcile_duckdb.py) on the planted dataset: its percentiles are
the exact nearest-rank ones, so the benchmark's comparison of the two engines is against a true value.

``approx_quantile`` (a t-digest) interpolated between the few samples of a small input and gave values no
pair had; ``quantile_disc`` is the ``ceil(p·n)``-th smallest, as :func:`exact_percentiles` computes it.
"""

from __future__ import annotations

import datetime as dt
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
