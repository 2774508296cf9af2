"""Helpers of the Kafka tests: an effects table, producing test records, reading a topic to its end."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, delete, func, select
from sqlalchemy.orm import Session

from reliable import Envelope
from reliable import constants as C
from reliable.adapters.kafka import KafkaGuardedConsumer, RetryPolicy
from reliable.demo.tansu import FAST_GROUP
from reliable.models import MessageLog

TIMEOUT_S = 30.0

effects_md = MetaData()
effects = Table(
    "kafka_test_effect",
    effects_md,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(64), nullable=False),
    Column("consumer_group", String(255), nullable=False),
    Column("position", String(255), nullable=False),
)


def reset_effects(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(delete(effects))


def apply_effect(group: str) -> Callable[[Envelope, Session], None]:
    """A handler whose only effect is one row per call, through the guard's session."""

    def handler(env: Envelope, session: Session) -> None:
        session.execute(
            effects.insert().values(
                message_id=env.message_id,
                consumer_group=group,
                position=f"{env.delivered_topic or env.topic}-{env.queue_id}@{env.queue_offset}",
            )
        )

    return handler


def effect_counts(engine: Engine, group: str | None = None) -> dict[str, int]:
    stmt = select(effects.c.message_id, func.count()).group_by(effects.c.message_id)
    if group is not None:
        stmt = stmt.where(effects.c.consumer_group == group)
    with engine.connect() as conn:
        return {m: n for m, n in conn.execute(stmt)}


def log_rows(engine: Engine, group: str) -> list[tuple[str, str, str]]:
    """(message_id, outcome, reason) of the group's journal, oldest first."""
    stmt = (
        select(MessageLog.message_id, MessageLog.outcome, MessageLog.reason)
        .where(MessageLog.consumer_group == group)
        .order_by(MessageLog.id)
    )
    with engine.connect() as conn:
        return [(m, str(o), r or "") for m, o, r in conn.execute(stmt)]


def _delivered(into: list[tuple[KafkaError | None, Message]], err: KafkaError | None, msg: Message) -> None:
    into.append((err, msg))


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes, Sequence[tuple[str, bytes]]]],
    partition: int | None = None,
) -> list[tuple[int, int]]:
    """Produce ``(key, value, headers)`` records one by one; their (partition, offset)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    out: list[tuple[int, int]] = []
    for key, value, headers in records:
        got: list[tuple[KafkaError | None, Message]] = []
        kwargs: dict[str, Any] = {} if partition is None else {"partition": partition}
        producer.produce(
            topic,
            key=key,
            value=value,
            headers=list(headers),
            on_delivery=partial(_delivered, got),
            **kwargs,
        )
        producer.flush(10)
        err, msg = got[0]
        assert err is None, err
        landed_partition, landed_offset = msg.partition(), msg.offset()
        assert landed_partition is not None and landed_offset is not None  # a delivered record has both
        out.append((landed_partition, landed_offset))
    return out


def with_ids(
    ids: Iterable[str], body: Callable[[str], bytes] = lambda i: f"body-{i}".encode()
) -> list[tuple[bytes | None, bytes, Sequence[tuple[str, bytes]]]]:
    return [(i.encode(), body(i), [("message-id", i.encode())]) for i in ids]


def read_all(
    bootstrap: str, topic: str, expect: int, partitions: int = 1, timeout_s: float = 10.0
) -> list[Any]:
    """The records of ``topic`` (assigned directly, no group): ``expect`` of them, and no more.

    Not bounded by the high watermark: Tansu 0.6 answers ListOffsets with the last *batch*'s base offset
    + 1, which hides the rest of a multi-record batch (docs/adapters.md, Kafka). After ``expect`` records
    arrived, one more short poll window catches any extra record.
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < expect and time.monotonic() < deadline:
        msg = consumer.poll(0.1)
        if msg is not None and not msg.error():
            out.append(msg)
    extra_until = time.monotonic() + 0.3
    while time.monotonic() < extra_until:
        msg = consumer.poll(0.05)
        if msg is not None and not msg.error():
            out.append(msg)
    consumer.close()
    return out


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return [
            tp.offset
            for tp in consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        ]
    finally:
        consumer.close()


def make_consumer(
    bootstrap: str, topic: str, group: str, handler: Any, **kwargs: Any
) -> KafkaGuardedConsumer:
    kwargs.setdefault("retry", RetryPolicy(delays_s=(0.3, 0.6)))
    return KafkaGuardedConsumer(bootstrap, topic, group, handler, config=FAST_GROUP, **kwargs)


def headers_of(msg: Any) -> dict[str, str]:
    return {k: (v or b"").decode("utf-8", "replace") for k, v in msg.headers() or []}


def dead_letters(
    bootstrap: str, topic: str, group: str, message_id: str, expect: int
) -> list[dict[str, str]]:
    """The headers of ``group``'s dead letters of ``message_id`` in ``topic``'s DLT (``expect``: how many
    records the DLT is read for, every group's)."""
    return [
        h
        for h in map(headers_of, read_all(bootstrap, f"{topic}.dlt", expect=expect))
        if h.get(C.KAFKA_HEADER_RETRY_GROUP) == group and h.get(C.KAFKA_ID_HEADER) == message_id
    ]


#: bad input for both consumer loops: an id header that is not UTF-8, a record with no id source, a good one
BAD_RECORDS: list[tuple[bytes | None, bytes, Sequence[tuple[str, bytes]]]] = [
    (b"k-bad-header", b"v1", [("message-id", b"\xff\xfe not utf-8")]),
    (None, b"no id at all", []),
    (b"fine", b"v3", [("message-id", b"fine")]),
]


def assert_bad_records_dead_lettered(bootstrap: str, topic: str) -> None:
    """The two bad records of :data:`BAD_RECORDS` are in the DLT with their reasons, bad bytes untouched."""
    dead = read_all(bootstrap, f"{topic}.dlt", expect=2)
    reasons = {m.value(): headers_of(m)[C.KAFKA_HEADER_REASON] for m in dead}
    assert reasons.keys() == {b"v1", b"no id at all"}
    assert "undecodable" in reasons[b"v1"] and "'message-id' is not UTF-8" in reasons[b"v1"]
    assert "missing_message_id" in reasons[b"no id at all"]
    assert dict(next(m for m in dead if m.value() == b"v1").headers())["message-id"] == b"\xff\xfe not utf-8"


def assert_bad_records_journaled(engine: Engine, group: str, topic: str) -> None:
    """Both bad records of :data:`BAD_RECORDS` have a ``DEAD_LETTER`` row at their delivered position: the
    undecodable one under its position's stand-in id (the reconciliation report counts it), the one
    without id under none."""
    log = MessageLog
    stmt = select(log.message_id, log.topic, log.queue_id, log.queue_offset, log.reason).where(
        log.consumer_group == group, log.outcome == "DEAD_LETTER"
    )
    with engine.connect() as conn:
        rows = {r.queue_offset: r for r in conn.execute(stmt)}
    assert sorted(rows) == [0, 1]
    bad = rows[0]
    assert (bad.message_id, bad.topic, bad.queue_id) == (f"undecodable:{topic}-0-0", topic, 0)
    assert bad.reason.startswith("bad_message: undecodable: ") and "'message-id' is not UTF-8" in bad.reason
    assert rows[1].reason.startswith("missing_message_id")


def worker_status(path: Path) -> dict[str, Any]:
    """What a ``tests.adapters.kafka.worker`` process last wrote about itself (before its first write: no
    partition, nothing processed)."""
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {"assigned": [], "processed": 0}
