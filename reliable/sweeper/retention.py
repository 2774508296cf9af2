"""Log retention: the journal purged in batches, never the evidence the sweeper still needs.

Retention: ``message_log`` rows older than ``log_retention`` are deleted in batches — but never a row whose
group's inbox row is still ``PENDING`` or ``DEAD``. Those rows are the evidence the sweeper relies on:
without them a received-but-unconfirmed row would look never received and be re-sent, and a revived DEAD row
would lose its history. The consumer's position survives the purge in ``consume_progress``. The purge
yields to consumers (:mod:`.throttle`): small transactions committed without waiting for the disk, a rest
after each batch (duty cycle, longer while batches slow down), and at most ``budget_s`` per call.
``log_retention = 0`` is the seed's "delete the log on success": every round deletes the log of every
confirmed (or voided) row. Rows of a group with no inbox row age out like confirmed ones. (What a person does
with a row the sweeper gave up on is in :mod:`reliable.sweeper.resolve`.)
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, Exists, Select, delete, exists, select

from reliable import constants as C
from reliable.sweeper.selection import inbox
from reliable.sweeper.selection import log as log_t
from reliable.sweeper.throttle import Throttle
from reliable.types import StubStatus

#: statuses whose log rows are kept whatever their age
PROTECTED = (StubStatus.PENDING, StubStatus.DEAD)


def purge_logs(
    engine: Engine,
    *,
    now: dt.datetime,
    retention: dt.timedelta,
    batch: int = C.DEFAULT_PURGE_BATCH,
    duty_cycle: float = C.DEFAULT_PURGE_DUTY_CYCLE,
    budget_s: float | None = None,
    rest: Callable[[float], object] = time.sleep,
    timer: Callable[[], float] = time.perf_counter,
    should_stop: Callable[[], bool] = lambda: False,
    on_batch: Callable[[int, float], None] | None = None,
) -> int:
    """Delete old log rows of settled inbox rows; returns how many. One short transaction per batch.

    Each batch walks the ``received_at`` index upwards from where the previous one stopped (keyset), so a
    batch costs ``batch`` index steps however many rows were deleted or kept before it: restarting from the
    oldest row would step over every dead tuple left by earlier batches and every protected row again.

    Between batches it rests as :class:`~reliable.sweeper.throttle.Throttle` says (``duty_cycle`` 1: never);
    ``rest`` is how (the sweeper passes its stop event's ``wait``, so a stop ends the rest). It returns early
    when ``should_stop()`` or when ``budget_s`` seconds have passed (the rows left are purged next call).
    ``on_batch(rows, seconds)`` is told each batch (progress, metrics).
    """
    cutoff = now - retention
    protected = exists().where(
        inbox.c.message_id == log_t.c.message_id,
        inbox.c.consumer_group == log_t.c.consumer_group,
        inbox.c.status.in_(PROTECTED),
    )
    throttle = Throttle(duty_cycle)
    started = timer()
    total = 0
    since: dt.datetime | None = None
    while True:
        t = timer()
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # at 10 M expired rows the planner fans the first batches out to parallel workers: a
                # background purge must not take every core from the consumers for a few thousand rows
                conn.exec_driver_sql("SET LOCAL max_parallel_workers_per_gather = 0")
                # a purge batch lost in a crash is simply purged again: do not make the consumers' commits
                # queue behind this one's WAL flush
                conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
            elif conn.dialect.name in ("mysql", "mariadb"):
                # InnoDB's default REPEATABLE READ takes next-key locks on what the DELETE scans — on a small
                # table up to the index's supremum, where every consumer's journal INSERT lands: they waited
                # for each batch (until 2026-11-28). READ COMMITTED locks the deleted rows only.
                conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            rows = conn.execute(find_batch(cutoff, since, batch, protected)).all()
            if not rows:
                return total
            ids = [r.id for r in rows]
            # re-check protection in the DELETE itself: a row cannot go back to PENDING except by revive,
            # which only takes DEAD rows (protected) — but a second condition here keeps the invariant local.
            conn.execute(delete(log_t).where(log_t.c.id.in_(ids), ~protected))
        took = timer() - t
        total += len(ids)
        if on_batch is not None:
            on_batch(len(ids), took)
        if len(ids) < batch or should_stop():
            return total
        if budget_s is not None and timer() - started >= budget_s:
            return total
        # inclusive: rows sharing the last timestamp may remain; the deleted ones are gone
        since = rows[-1].received_at
        pause = throttle.rest_after(took)
        if pause > 0:
            rest(pause)


def find_batch(cutoff: dt.datetime, since: dt.datetime | None, batch: int, protected: Exists) -> Select[Any]:
    """The next ``batch`` purgeable log rows, oldest first, from ``since`` (inclusive) on."""
    q = select(log_t.c.id, log_t.c.received_at).where(log_t.c.received_at <= cutoff, ~protected)
    if since is not None:
        q = q.where(log_t.c.received_at >= since)
    return q.order_by(log_t.c.received_at).limit(batch)
