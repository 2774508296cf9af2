"""Fan-out at the producer: one stub, one inbox row per consumer group that must process the message —
groups given per message, from settings per topic, or the default group; voiding only the open rows; topic
and group names each broker family accepts."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from reliable import Reliability, StubProducer, StubStatus
from reliable.errors import (
    DuplicateMessageIdError,
    InvalidMessageError,
)
from reliable.models import MessageInbox, MessageStub
from tests.core.producer.support import RecordingSender, inbox


def test_stage_for_several_groups_writes_one_inbox_row_each(
    rel: Reliability, producer: StubProducer, sender: RecordingSender
) -> None:
    with rel.session() as s:
        staged = producer.stage(s, "f-1", "orders", b"x", groups=["billing", "audit", "search", "audit"])
    assert staged.groups == ("billing", "audit", "search")  # in order, each once
    assert len(sender.sent) == 1  # one send to the topic, whatever the number of groups
    assert set(inbox(rel, "f-1")) == {"billing", "audit", "search"}
    assert {st for st, _ in inbox(rel, "f-1").values()} == {StubStatus.PENDING}
    with pytest.raises(DuplicateMessageIdError):  # one message, one stub: fan-out is groups=, not a 2nd stub
        producer.publish("f-1", "orders", b"x", groups=["ledger"])


def test_topic_subscribers_come_from_settings_then_the_default_group(
    db_url: str, sender: RecordingSender, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELIABLE_TOPIC_GROUPS", "orders=billing,audit;payments=ledger")
    with Reliability(db_url) as rel:
        assert rel.settings.topic_groups == {"orders": ("billing", "audit"), "payments": ("ledger",)}
        producer = StubProducer(rel, sender, default_group="fallback")
        producer.publish("s-1", "orders", b"1")
        producer.publish("s-2", "payments", b"2")
        producer.publish("s-3", "refunds", b"3")  # not configured: the producer's default group
        producer.publish("s-4", "orders", b"4", groups=["only-me"])  # explicit groups win
        assert set(inbox(rel, "s-1")) == {"billing", "audit"}
        assert set(inbox(rel, "s-2")) == {"ledger"}
        assert set(inbox(rel, "s-3")) == {"fallback"}
        assert set(inbox(rel, "s-4")) == {"only-me"}
    with Reliability(db_url, topic_groups={}, default_group="settings-default") as rel:
        StubProducer(rel, sender).publish("s-5", "orders", b"5")
        assert set(inbox(rel, "s-5")) == {"settings-default"}


def test_void_before_every_group_confirmed_voids_the_open_rows_only(
    rel: Reliability, producer: StubProducer
) -> None:
    producer.publish("v-3", "orders", b"x", groups=["billing", "audit"])
    with rel.session() as s:
        s.execute(
            update(MessageInbox)
            .where(MessageInbox.message_id == "v-3", MessageInbox.consumer_group == "billing")
            .values(status=StubStatus.CONFIRMED)
        )
    producer.void("v-3")
    assert {g: st for g, (st, _) in inbox(rel, "v-3").items()} == {
        "billing": StubStatus.CONFIRMED,  # done is done
        "audit": StubStatus.VOIDED,
    }


def test_kafka_style_topic_stages_unless_the_sender_is_rocketmq(rel: Reliability) -> None:
    """Kafka topics and groups commonly carry dots ("orders.v1"): a broker-neutral sender accepts them, while
    a RocketMQ-family sender (whose broker refuses them: ``Validators.PATTERN``) refuses them at staging time,
    before any row is written — not later as a stub no send can ever deliver."""
    from reliable.adapters.broker_sim import BrokerSimSender

    neutral = StubProducer(rel, RecordingSender())
    neutral.publish("kafka-1", "orders.v1", b"{}", groups=["billing.eu"])
    rocket = StubProducer(rel, BrokerSimSender(producer=None))  # type: ignore[arg-type]  # never sends
    with pytest.raises(InvalidMessageError, match="not a valid name for BrokerSimSender"):
        rocket.publish("rocket-1", "orders.v1", b"{}", groups=["billing"])
    with pytest.raises(InvalidMessageError, match=r"consumer group 'billing\.eu'"):
        rocket.publish("rocket-2", "orders", b"{}", groups=["billing.eu"])
    with rel.session() as s:
        ids = set(s.scalars(select(MessageStub.message_id)))
    assert ids == {"kafka-1"}
