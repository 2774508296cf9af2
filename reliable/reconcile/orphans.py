"""Orphan logs: deliveries whose message id has no stub at all, in any window (docs/reconcile.md).

Apart from :mod:`.transforms` because the finding needs its own join strategy: the candidates are usually
few (a broadcast probe of the unwindowed stub ids), sometimes many (a window whose later deliveries have no
pair in it: a shuffled anti-join), and the caller, who counted them, chooses.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from reliable.reconcile.config import ReconcileConfig
from reliable.reconcile.inputs import in_log_window
from reliable.reconcile.transforms import DELIVERY_DETAIL, MESSAGE_KEY


def orphan_candidates(enriched: DataFrame) -> DataFrame:
    """(message_id, consumer_group) delivered but without a pair *in the window*."""
    return enriched.where(~F.col("has_pair")).select(*MESSAGE_KEY)


def orphan_logs(
    classified: DataFrame,
    candidates: DataFrame,
    all_stub_ids: DataFrame,
    cfg: ReconcileConfig,
    *,
    few_candidates: bool = False,
) -> DataFrame:
    """Deliveries in the window whose message id has no stub at all (any time).

    ``all_stub_ids`` is the unwindowed ``message_id`` column: a delivery of a message created before the
    window is not an orphan, and neither is a delivery to a group the producer did not list (the guard gave
    that group its own inbox row; the id is known).

    ``few_candidates`` (the caller counted them): the candidate ids are broadcast, so the stub ids are only
    scanned and probed, never shuffled; otherwise (a window whose later deliveries have no pair in it) the
    anti-join shuffles both sides.
    """
    ids = candidates.select("message_id").distinct()
    if few_candidates:
        known = all_stub_ids.join(F.broadcast(ids), "message_id", "left_semi")
        orphan_ids = ids.join(F.broadcast(known), "message_id", "left_anti")
    else:
        orphan_ids = ids.join(all_stub_ids, "message_id", "left_anti")
    return (
        classified.where(in_log_window(cfg))
        .join(F.broadcast(orphan_ids) if few_candidates else orphan_ids, "message_id", "left_semi")
        .select(*DELIVERY_DETAIL, F.col("id").alias("log_id"))
    )
