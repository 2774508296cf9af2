"""What the broker writes into a record's properties, byte for byte as RocketMQ 4.9.8's
``SendMessageProcessor`` + ``MessageDecoder.messageProperties2String`` do."""

from __future__ import annotations

from broker_sim import Broker, Message, Producer
from broker_sim.common.message import Prop
from broker_sim.store.message_record import decode_record


def _props_field(raw: bytes) -> bytes:
    """The PROPERTIES field of a record (its last ``PROPERTIESLEN`` bytes)."""
    ext = decode_record(raw)
    encoded_len = len(raw) - (91 + len(ext.body) + len(ext.topic.encode()))
    return raw[len(raw) - encoded_len :]


def test_properties_have_no_trailing_separator_and_carry_the_cluster(broker: Broker) -> None:
    """messageProperties2String drops the last \\x02; SendMessageProcessor adds CLUSTER = the broker's
    cluster name and does not store WAIT."""
    p = Producer(broker, "P")
    sent = p.send(Message("T", b"x", keys="k1", tags="A", wait_store_msg_ok=False))
    props = _props_field(
        broker.store.select_one_message_by_offset(
            broker.view_message_by_id(sent.offset_msg_id).commit_log_offset
        )
        or b""
    )
    assert not props.endswith(b"\x02")
    pairs = dict(item.split(b"\x01", 1) for item in props.split(b"\x02"))
    assert pairs[b"CLUSTER"] == b"DefaultCluster"
    assert pairs[b"KEYS"] == b"k1" and pairs[b"TAGS"] == b"A"
    assert b"WAIT" not in pairs
    assert broker.view_message_by_id(sent.offset_msg_id).properties[Prop.CLUSTER] == "DefaultCluster"
    p.shutdown()


def test_every_message_of_a_batch_gets_the_cluster(broker: Broker) -> None:
    """SendMessageProcessor.asyncSendBatchMessage puts CLUSTER on the batch; CommitLog appends the batch's
    properties to each message's own."""
    p = Producer(broker, "P")
    result = p.send_batch([Message("T", b"a", keys="b1"), Message("T", b"b", keys="b2")])
    for msg_id in result.offset_msg_id.split(","):
        stored = broker.view_message_by_id(msg_id)
        assert stored.properties[Prop.CLUSTER] == "DefaultCluster"
    p.shutdown()
