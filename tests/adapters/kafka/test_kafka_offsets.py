"""Kafka offsets in the application database, on SQLite, PostgreSQL and MariaDB (no broker needed)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from reliable import ConsumeResult, Envelope, Reliability, idempotent_consumer
from reliable import constants as C
from reliable.adapters.kafka_common import Record, to_envelope
from reliable.adapters.kafka_offsets import load, next_offset, offsets_in_db, record_engine, with_floor


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


def test_the_position_stored_in_the_transaction_stops_at_the_loops_commit_floor(db_url: str) -> None:
    """The loop's floor caps the stored position (an earlier record of the partition is not final yet); a
    producer cannot set one through a header, and without a floor it is one past the record."""
    rel = Reliability(db_url)
    handle = idempotent_consumer(rel, group="g")(offsets_in_db("g")(lambda e, s: None))
    try:
        assert handle(with_floor(env(7, "m7"), 5, None)) is ConsumeResult.SUCCESS
        assert load(rel.engine, "g", ["orders"]) == {("orders", 1): 5}
        assert next_offset(with_floor(env(7, "m7"), None, 20)) == 8  # a floor above the record: no cap
        assert next_offset(with_floor(env(7, "m7"), None, None)) == 8
        record = Record("orders", 1, 9, b"k", b"v", [(C.KAFKA_COMMIT_FLOOR_PROPERTY, b"0")], None)
        assert C.KAFKA_COMMIT_FLOOR_PROPERTY not in to_envelope(record).properties
    finally:
        handle.close()
        rel.close()
