"""A resend is the message its producer staged: the same properties, and no earlier than the broker's delay.

Before migration 0009 a resend carried only the trace context and the resend mark: a message whose first send
failed reached its consumers without the properties the producer gave it, and a delayed message (RocketMQ's
``DELAY`` level) came due for the sweeper after ``first_resend_delay_s`` — long before the broker would
deliver it — and was re-sent without its delay, so its consumers got it early.
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select

from reliable import Reliability
from reliable.errors import InvalidMessageError
from reliable.models import MessageStub
from reliable.producer import StubProducer
from reliable.staged import stored_properties
from reliable.sweeper import FixedBackoff, Sweeper
from reliable.sweeper.resend import RESEND_PROPERTY
from tests.sweeper.helpers import Clock, QueueSender, set_progress

FIRST_DELAY_S = 60  # the default first_resend_delay_s
TWO_MINUTES = "6"  # RocketMQ's delay level 6: 2 m


def _stage(rel: Reliability, sender: QueueSender, clock: Clock, mid: str, properties: dict[str, str]) -> None:
    producer = StubProducer(rel, sender, default_group="billing", clock=clock)
    with rel.session() as s:
        producer.stage(s, mid, "orders", b"{}", properties=properties)


def _sweeper(rel: Reliability, sender: QueueSender, clock: Clock) -> Sweeper:
    return Sweeper(rel, sender, backoff=FixedBackoff((10.0,)), clock=clock)


def test_a_resend_carries_the_properties_its_producer_staged(rel: Reliability, clock: Clock) -> None:
    sender = QueueSender()
    sender.fail_next = 1  # the after-commit send fails: the sweeper sends it
    _stage(rel, sender, clock, "m-props", {"biz": "refund", "region": "eu"})
    assert sender.sent == []
    clock.advance(FIRST_DELAY_S + 1)
    assert _sweeper(rel, sender, clock).run_once().resent == 1
    [copy] = sender.sent
    assert copy.properties == {"biz": "refund", "region": "eu", RESEND_PROPERTY: "1"}


def test_a_delayed_message_is_not_looked_for_before_the_broker_delivers_it(
    rel: Reliability, clock: Clock
) -> None:
    """The send lands (the broker parks it for 2 minutes; its receipt's offset is not the topic queue's).
    The sweeper must not judge it before the broker can have delivered it — nor, when the broker lost it
    after all, re-send it without its delay."""
    sender = QueueSender(queues=1)
    _stage(rel, sender, clock, "m-later", {"DELAY": TWO_MINUTES})
    _stage(rel, sender, clock, "m-now", {})
    with rel.session() as s:
        due = {m: at for m, at in s.execute(select(MessageStub.message_id, MessageStub.resend_at))}
    assert _utc(due["m-later"]) == clock.now + dt.timedelta(seconds=FIRST_DELAY_S + 120)
    assert _utc(due["m-now"]) == clock.now + dt.timedelta(seconds=FIRST_DELAY_S)
    set_progress(rel, 1_000_000)  # the group is past both offsets: either would be "overtaken"

    def resent(mid: str) -> list[dict[str, str]]:
        return [dict(m.properties) for m in sender.sent if m.message_id == mid and m.target_group is not None]

    clock.advance(FIRST_DELAY_S + 1)
    _sweeper(rel, sender, clock).run_once()
    assert (len(resent("m-now")), resent("m-later")) == (1, [])  # m-later: the broker is still holding it
    clock.advance(120)
    _sweeper(rel, sender, clock).run_once()
    [later] = resent("m-later")
    assert later["DELAY"] == TWO_MINUTES  # delayed again, not delivered early


@pytest.mark.parametrize("properties", [{"a": 1}, {"a": None}, {"": "x"}, {"DELAY": "soon"}, {"a": "x\x00"}])
def test_properties_no_broker_can_carry_are_refused_before_anything_is_written(
    rel: Reliability, clock: Clock, properties: dict[str, object]
) -> None:
    with pytest.raises(InvalidMessageError):
        _stage(rel, QueueSender(), clock, "m-bad", properties)  # type: ignore[arg-type]
    with rel.session() as s:
        assert s.scalar(select(MessageStub.message_id)) is None


def _utc(value: dt.datetime | None) -> dt.datetime:
    assert value is not None
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def test_stored_properties_that_are_not_a_json_object_are_said_and_the_resend_still_goes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="reliable.producer"):
        assert stored_properties('["edited", "by hand"]') == {} and stored_properties("{oops") == {}
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "message_stub.properties is not a JSON object",
        "message_stub.properties is not JSON",
    ]
    assert stored_properties('{"biz": "refund"}') == {"biz": "refund"}
