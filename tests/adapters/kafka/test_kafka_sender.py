"""The Kafka Sender and broker probe, fan-out to two groups, and a broker loss repaired by the sweeper."""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pytest
from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, StubProducer, idempotent_consumer
from reliable import constants as C
from reliable.adapters.kafka import KafkaGuardedConsumer, KafkaProbe, KafkaSender, RetryPolicy, ensure_topics
from reliable.demo.tansu import Tansu
from reliable.errors import SendError
from reliable.sender import BrokerProbe, OutgoingMessage, Sender
from reliable.sweeper import Sweeper
from tests.adapters.kafka.helpers import (
    TIMEOUT_S,
    apply_effect,
    effect_counts,
    make_consumer,
    produce,
    read_all,
    with_ids,
)

pytestmark = [pytest.mark.kafka]


def outgoing(mid: str, topic: str, **kw: Any) -> OutgoingMessage:
    fields: dict[str, Any] = {"message_id": mid, "topic": topic, "body": f"body-{mid}".encode(), **kw}
    if "consumer_group" in OutgoingMessage.__dataclass_fields__:  # until issue #11 removes it
        fields.setdefault("consumer_group", "billing")
    return OutgoingMessage(**fields)


def test_the_receipt_is_the_delivery_reports_partition_and_offset(tansu: Tansu, topic: str) -> None:
    # named twice (two groups' policies both list the topic): created once, not a protocol error
    ensure_topics(tansu.bootstrap, [topic, topic], partitions=3)
    with KafkaSender(tansu.bootstrap) as sender:
        assert isinstance(sender, Sender) and isinstance(sender, BrokerProbe)
        receipts = {
            mid: sender.send(outgoing(mid, topic, tags="TagA", send_count=2, target_group="audit"))
            for mid in ("a", "b", "c", "d")
        }
        for r in receipts.values():  # the probe's high watermark is one past the last stored record
            assert r.queue_offset < (sender.max_offset(topic, r.queue_id) or 0)
        again = sender.send(outgoing("a", topic))
        assert again.queue_id == receipts["a"].queue_id  # the key is the id: a resend keeps its partition
        assert sender.max_offset(topic, 99) is None
        assert sender.max_offset("no-such-topic-" + topic, 0) in (None, 0)
    stored = {
        (m.partition(), m.offset()): m for m in read_all(tansu.bootstrap, topic, expect=5, partitions=3)
    }
    for mid, r in receipts.items():
        msg = stored[(r.queue_id, r.queue_offset)]
        headers = {k: v.decode() for k, v in msg.headers()}
        assert (msg.key(), msg.value()) == (mid.encode(), f"body-{mid}".encode())
        assert headers[C.KAFKA_ID_HEADER] == mid
        assert headers[C.KAFKA_HEADER_TAGS] == "TagA"
        assert headers[C.KAFKA_HEADER_TARGET_GROUP] == "audit"
        assert headers[C.KAFKA_HEADER_SEND_COUNT] == "2"


def test_a_send_the_broker_does_not_acknowledge_raises(topic: str) -> None:
    from broker_sim.common.net import listen_port

    with KafkaSender(f"127.0.0.1:{listen_port()}", timeout_s=1.0) as sender, pytest.raises(SendError):
        sender.send(outgoing("x", topic))


def test_the_sender_recovers_after_the_broker_lost_everything(private_tansu: Tansu, topic: str) -> None:
    ensure_topics(private_tansu.bootstrap, [topic])
    with KafkaSender(private_tansu.bootstrap, timeout_s=2.0) as sender:
        assert sender.send(outgoing("a", topic)).queue_offset == 0
        private_tansu.restart()  # memory storage: the topic and the idempotent producer's state are gone
        ensure_topics(private_tansu.bootstrap, [topic])
        # the first send after the loss needs a fresh idempotent producer; send() takes one by itself
        receipts = [sender.send(outgoing(mid, topic)) for mid in ("b", "c", "d")]
        assert [r.queue_offset for r in receipts] == [0, 1, 2]
        assert sender.max_offset(topic, 0) == len(receipts)
        assert sender.min_offset(topic, 0) == 0  # the log start offset: no retention has deleted any


@pytest.mark.postgres
@pytest.mark.redis
def test_lag_is_the_high_watermark_minus_the_committed_offset(
    tansu: Tansu, rel: Reliability, topic: str, group: str
) -> None:
    policy = RetryPolicy(delays_s=(0.3,))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic), partitions=2)
    produce(tansu.bootstrap, topic, with_ids(["a", "b", "c"]), partition=0)
    produce(tansu.bootstrap, topic, with_ids(["d"]), partition=1)
    probe = KafkaProbe(tansu.bootstrap)
    try:
        assert probe.lag(group, topic, [0, 1]) == {0: 3, 1: 1}  # nothing committed yet
        handle = idempotent_consumer(rel, group=group)(apply_effect(group))
        with make_consumer(tansu.bootstrap, topic, group, handle, retry=policy) as consumer:
            assert consumer.run(until=lambda: consumer.counts["success"] >= 4, timeout_s=TIMEOUT_S)
        produce(tansu.bootstrap, topic, with_ids(["e", "f"]), partition=1)
        assert probe.lag(group, topic, [0, 1]) == {0: 0, 1: 2}
    finally:
        probe.close()


@pytest.mark.postgres
@pytest.mark.redis
def test_fan_out_every_group_applies_every_record_once(tansu: Tansu, rel: Reliability, topic: str) -> None:
    groups = ("billing-" + topic, "audit-" + topic)
    policies = {g: RetryPolicy(delays_s=(0.3,), scope=g.split("-")[0]) for g in groups}
    for policy in policies.values():
        ensure_topics(tansu.bootstrap, policy.all_topics(topic), partitions=2)
    ids = [f"m{i}" for i in range(12)]
    produce(tansu.bootstrap, topic, with_ids(ids))
    failed: list[str] = []

    def billing(env: Envelope, session: Session) -> None:
        if env.message_id == "m5" and not failed:
            failed.append("m5")
            raise RuntimeError("billing fails m5 once")
        apply_effect(groups[0])(env, session)

    handlers = {groups[0]: billing, groups[1]: apply_effect(groups[1])}
    consumers = {
        g: make_consumer(
            tansu.bootstrap, topic, g, idempotent_consumer(rel, group=g)(handlers[g]), retry=policies[g]
        )
        for g in groups
    }

    def all_settled(consumer: KafkaGuardedConsumer) -> bool:
        return consumer.counts["success"] + consumer.counts["dead_letter"] >= len(ids)

    with ThreadPoolExecutor(2) as pool:  # both groups at once, each in its own thread
        runs = [pool.submit(c.run, partial(all_settled, c), TIMEOUT_S) for c in consumers.values()]
        assert all(r.result() for r in runs)
    for g, consumer in consumers.items():
        consumer.close()
        assert consumer.counts["dead_letter"] == 0 and consumer.counts["duplicate"] == 0
        assert effect_counts(rel.engine, g) == {i: 1 for i in ids}
    assert consumers[groups[0]].counts["retry_topic"] == 1  # billing's retry stayed in billing's topics
    assert consumers[groups[1]].counts["success"] == len(ids)


@pytest.mark.postgres
@pytest.mark.redis
class CannotTell:
    """A probe that never knows (the control: without the broker's word the loss stays unproven)."""

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return None


def test_a_message_lost_by_a_broker_restart_is_resent_by_the_sweeper_through_the_probe(
    private_tansu: Tansu, rel: Reliability, topic: str, group: str
) -> None:
    policy = RetryPolicy(delays_s=(0.3,))
    ensure_topics(private_tansu.bootstrap, policy.all_topics(topic))
    handle = idempotent_consumer(rel, group=group)(apply_effect(group))
    sender = KafkaSender(private_tansu.bootstrap, timeout_s=3.0)
    producer = StubProducer(rel, sender)
    with make_consumer(private_tansu.bootstrap, topic, group, handle, retry=policy) as consumer:
        producer.publish("first", topic, b"body-first", groups=[group])
        assert consumer.run(until=lambda: consumer.counts["success"] >= 1, timeout_s=TIMEOUT_S)
    # acknowledged at offset 1, then the broker loses everything (memory storage restart) on a quiet topic
    assert producer.publish("lost", topic, b"body-lost", groups=[group]).receipt is not None
    private_tansu.restart()
    ensure_topics(private_tansu.bootstrap, policy.all_topics(topic))
    # an hour on: past the first resend delay and the postponement below, not yet "too old" (a day)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    held = Sweeper(rel, sender, probe=CannotTell(), clock=lambda: later).run_once()
    assert (held.selected, held.resent) == (1, 0)  # without the broker's word it may just be queued
    assert sender.max_offset(topic, 0) == 0  # the broker's word: it holds nothing at offset 1
    much_later = later + dt.timedelta(hours=2)
    assert Sweeper(rel, sender, clock=lambda: much_later).run_once().resent == 1  # the sender is the probe
    with make_consumer(private_tansu.bootstrap, topic, group, handle, retry=policy) as consumer:
        assert consumer.run(until=lambda: consumer.counts["success"] >= 1, timeout_s=TIMEOUT_S)
    assert effect_counts(rel.engine, group) == {"first": 1, "lost": 1}
    sender.close()
