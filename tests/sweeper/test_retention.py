"""The retention purge: bounded batches, and never the evidence the sweeper needs."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import event, insert, select
from sqlalchemy.exc import OperationalError

from reliable import Reliability
from reliable.models import MessageLog
from reliable.sweeper import purge_logs
from reliable.types import StubStatus
from tests.sweeper.helpers import T0, add_log, add_stub, clean


def test_purge_deletes_in_bounded_batches_and_keeps_pending_and_dead_evidence(rel: Reliability) -> None:
    old = T0 - dt.timedelta(days=8)
    settled, kept = [], []
    # 17 settled rows, three to a timestamp so batch edges fall inside runs of equal timestamps, with a
    # PENDING and a DEAD row's log sharing those timestamps
    for i in range(17):
        name = f"ok{i:02d}"
        add_stub(rel, name, status=StubStatus.CONFIRMED)
        add_log(rel, name, old + dt.timedelta(minutes=i // 3))
        settled.append(name)
    for i, status in enumerate([StubStatus.PENDING, StubStatus.DEAD] * 4):
        name = f"{status.value.lower()}{i}"
        add_stub(rel, name, status=status)
        add_log(rel, name, old + dt.timedelta(minutes=i - 1))
        kept.append(name)
    add_stub(rel, "recent", status=StubStatus.CONFIRMED)
    add_log(rel, "recent", T0 - dt.timedelta(minutes=5))
    kept.append("recent")

    deletes: list[int] = []
    commits: list[int] = []

    def seen(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE FROM MESSAGE_LOG"):
            deletes.append(cursor.rowcount)

    event.listen(rel.engine, "after_cursor_execute", seen)

    def committed(conn: Any) -> None:
        commits.append(len(deletes))

    event.listen(rel.engine, "commit", committed)
    try:
        purged = purge_logs(rel.engine, now=T0, retention=dt.timedelta(days=7), batch=5)
    finally:
        event.remove(rel.engine, "after_cursor_execute", seen)
        event.remove(rel.engine, "commit", committed)

    assert purged == len(settled)
    assert deletes == [5, 5, 5, 2]  # never more than one batch per statement
    assert commits[: len(deletes)] == [1, 2, 3, 4]  # one transaction per batch
    with rel.engine.connect() as conn:
        left = sorted(conn.execute(select(MessageLog.message_id)).scalars())
    assert left == sorted(kept)


def test_a_purge_batch_on_mariadb_does_not_hold_up_a_consumers_journal_insert(mariadb_url: str) -> None:
    """While a batch's DELETE is done and its transaction still open, a consumer journals a new delivery. At
    InnoDB's default REPEATABLE READ the DELETE's scan left next-key locks up to the index's end, and the
    INSERT waited for the batch (on a young, small table: every time)."""
    rel = Reliability(mariadb_url, redis_url="")
    rel.create_schema()
    clean(rel.engine)
    other = Reliability(mariadb_url, redis_url="")
    old = T0 - dt.timedelta(days=8)
    try:
        for i in range(40):
            add_stub(rel, f"old{i}", status=StubStatus.CONFIRMED)
            add_log(rel, f"old{i}", old + dt.timedelta(seconds=i))
        outcome: list[str] = []

        def journal_meanwhile(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            if outcome or not statement.lstrip().upper().startswith("DELETE FROM MESSAGE_LOG"):
                return
            with other.engine.connect() as c2:
                c2.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1")
                try:
                    c2.execute(insert(MessageLog).values(
                        message_id="fresh", consumer_group="billing", topic="orders", queue_id=0,
                        queue_offset=99, reconsume_times=0, received_at=T0,
                    ))  # fmt: skip
                    c2.commit()
                    outcome.append("journaled")
                except OperationalError as exc:
                    outcome.append(f"waited: {exc.orig}")

        event.listen(rel.engine, "after_cursor_execute", journal_meanwhile)
        try:
            assert purge_logs(rel.engine, now=T0, retention=dt.timedelta(days=7), batch=1000) == 40
        finally:
            event.remove(rel.engine, "after_cursor_execute", journal_meanwhile)
        assert outcome == ["journaled"]
    finally:
        other.close()
        rel.close()
