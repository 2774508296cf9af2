"""Kafka offsets in the application database, on SQLite, PostgreSQL and MariaDB (no broker needed)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from reliable import ConsumeResult, Envelope, Reliability, idempotent_consumer
from reliable.adapters.kafka_offsets import load, offsets_in_db, record_engine


def env(
    offset: int, mid: str, topic: str = "orders", partition: int = 1, delivered: str | None = None
) -> Envelope:
    return Envelope(mid, topic, partition, offset, b"body", delivered_topic=delivered)


def test_the_stored_position_only_moves_forward(db_url: str) -> None:
    rel = Reliability(db_url)
    try:
        record_engine(rel.engine, "g", {("orders", 0): 5, ("orders", 1): 2})
        record_engine(rel.engine, "g", {("orders", 0): 3, ("orders", 1): 9})  # a late writer of an older one
        record_engine(rel.engine, "other", {("orders", 0): 100})
        assert load(rel.engine, "g", ["orders", "unknown"]) == {("orders", 0): 5, ("orders", 1): 9}
    finally:
        rel.close()


def test_the_position_commits_with_the_handlers_work_and_rolls_back_with_it(db_url: str) -> None:
    rel = Reliability(db_url, max_attempts=5)
    fail = {"m2"}

    def work(e: Envelope, session: Session) -> None:
        if e.message_id in fail:
            raise RuntimeError("boom")

    handle = idempotent_consumer(rel, group="g")(offsets_in_db("g")(work))
    try:
        assert handle(env(10, "m1")) is ConsumeResult.SUCCESS
        assert load(rel.engine, "g", ["orders"]) == {("orders", 1): 11}
        assert handle(env(11, "m2")) is ConsumeResult.RECONSUME_LATER
        assert load(rel.engine, "g", ["orders"]) == {("orders", 1): 11}  # rolled back with the failed work
        # a retry delivery records the retry topic's position, not the original topic's
        fail.clear()
        assert handle(env(3, "m2", partition=0, delivered="orders.retry.1")) is ConsumeResult.SUCCESS
        assert load(rel.engine, "g", ["orders", "orders.retry.1"]) == {
            ("orders", 1): 11,
            ("orders.retry.1", 0): 4,
        }
    finally:
        handle.close()
        rel.close()
