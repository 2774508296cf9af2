"""A message a real 5.x broker revived is journaled on the group's pop retry topic, not its own topic.

On RocketMQ 5.x a non-FIFO message whose invisible time runs out without an ack is revived into the group's
pop retry topic (``%RETRY%{group}_{topic}``, ``%RETRY%{group}+{topic}`` with ``enableRetryTopicV2``) at queue
0 and a new offset. The client shows the original topic; only the receipt handle says where the copy is:
field [4] (topic type "1"/"2") and fields [6]/[7] (the retry topic's queue and offset). Read as the topic's
own position, the delivery was journaled at queue 0 of the topic at an offset that is another message there,
raising that queue's watermark (the sweeper then re-sent queued messages, the report counted false *lost*).
Handles are written here in RocketMQ's layout (broker_sim's front end writes only topic type "0").
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reliable import constants as C
from reliable.adapters.rocketmq5 import to_envelope
from reliable.errors import ConfigurationError

TOPIC, GROUP = "orders", "audit"
V1, V2 = f"%RETRY%{GROUP}_{TOPIC}", f"%RETRY%{GROUP}+{TOPIC}"


def handle(topic_type: str, broker: str = "broker-a", queue_id: int = 0, offset: int = 7) -> str:
    """A receipt handle in RocketMQ's layout (ExtraInfoUtil): ck offset, pop time, invisible time, revive
    queue, topic type, broker, queue id, queue offset, commit-log offset."""
    return f"12 1700000000000 60000 3 {topic_type} {broker} {queue_id} {offset} 884422"


def received(receipt_handle: str, topic: str = TOPIC, **kw: object) -> SimpleNamespace:
    """What the 5.x client's ``Message`` exposes after a receive (the attributes the adapter reads)."""
    base: dict[str, object] = {
        "keys": {"m-1"}, "message_id": "01AB", "topic": topic, "receipt_handle": receipt_handle,
        "body": b"{}", "tag": None, "delivery_attempt": 2, "properties": {},
    }  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


brokers = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20)
queue_ids = st.integers(0, 2**31 - 1)
offsets = st.integers(0, 2**63 - 1)
names = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="%"), min_size=1)


@given(broker=brokers, queue_id=queue_ids, offset=offsets)
def test_a_delivery_from_its_own_topic_is_journaled_at_the_topics_position(
    broker: str, queue_id: int, offset: int
) -> None:
    env = to_envelope(received(handle("0", broker, queue_id, offset)), group=GROUP)
    assert (env.source_topic, env.broker_name, env.queue_id, env.queue_offset) == (
        TOPIC,
        broker[: C.BROKER_NAME_MAX],
        queue_id,
        offset,
    )
    assert env.delivered_topic is None


@given(broker=brokers, offset=offsets, v2=st.booleans())
def test_a_revived_delivery_is_at_the_groups_pop_retry_topic(broker: str, offset: int, v2: bool) -> None:
    env = to_envelope(received(handle("2" if v2 else "1", broker, 0, offset)), group=GROUP)
    assert (env.topic, env.source_topic, env.queue_id, env.queue_offset) == (
        TOPIC,
        V2 if v2 else V1,
        0,
        offset,
    )
    assert env.broker_name == broker[: C.BROKER_NAME_MAX] and env.message_id == "m-1"


@given(group=names, topic=names, v2=st.booleans())
def test_a_pop_retry_topic_is_neither_the_topic_nor_the_groups_4x_retry_topic(
    group: str, topic: str, v2: bool
) -> None:
    """The report and the sweeper special-case the exact ``%RETRY%{group}`` (a targeted resend's topic) and
    judge a message by its own topic's watermark: the pop retry topic is neither, and fits a topic column
    (the broker allows longer names) without becoming another group's or topic's name."""
    env = to_envelope(received(handle("2" if v2 else "1"), topic=topic), group=group)
    retry = env.source_topic
    assert retry not in (topic, f"%RETRY%{group}") and retry.startswith("%RETRY%")
    assert len(retry) <= C.TOPIC_MAX
    other = to_envelope(received(handle("2" if v2 else "1"), topic=topic + "x"), group=group)
    assert other.source_topic != retry


@pytest.mark.parametrize(
    "bad",
    ["", "opaque", handle("3"), handle("1", queue_id=-1).replace(" -1 ", " x ")],
    ids=["empty", "opaque", "unknown-topic-type", "bad-queue"],
)
def test_a_handle_without_a_readable_position_gives_an_unknown_one_never_the_topics(bad: str) -> None:
    env = to_envelope(received(bad), group=GROUP)
    assert (env.source_topic, env.queue_id, env.queue_offset) == (TOPIC, C.UNKNOWN_QUEUE_ID, -1)


def test_a_revived_delivery_without_the_group_is_refused_not_journaled_at_another_message() -> None:
    with pytest.raises(ConfigurationError, match="group"):
        to_envelope(received(handle("1")))
    assert to_envelope(received(handle("0"))).source_topic == TOPIC  # the topic's own: no group needed
