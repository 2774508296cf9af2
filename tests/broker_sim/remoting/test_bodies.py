"""Wire bodies: the C++ client's heartbeat, routes, lock sets, Java batch bodies and pulled records."""

from __future__ import annotations

import contextlib
import json
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_sim.common.message import MessageQueue
from broker_sim.common.requests import (
    BatchEntry,
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
)
from broker_sim.remoting import bodies
from broker_sim.remoting.errors import HeaderFieldError
from broker_sim.remoting.records import RecordError, decode_records, split_records, with_store_host
from broker_sim.store.message_record import MessageInner, encode_record, host_bytes

CPP_HEARTBEAT: dict[str, Any] = {  # a JSON document, as the C++ client sends it
    "clientID": "4242-127.0.0.1@DEFAULT",
    "consumerDataSet": [
        {
            "consumeFromWhere": 0,
            "consumeType": 1,
            "groupName": "G",
            "messageModel": 1,
            "subscriptionDataSet": [
                {"classFilterMode": False, "subString": "*", "subVersion": 1566, "tagsSet": [], "topic": "T"},
                {"subString": "*", "subVersion": "1567", "topic": "%RETRY%G"},
            ],
            "unitMode": False,
        }
    ],
}


def test_cpp_heartbeat_parses() -> None:
    hb = bodies.parse_heartbeat(json.dumps(CPP_HEARTBEAT).encode())
    assert hb.client_id == "4242-127.0.0.1@DEFAULT" and hb.producer_groups == ()
    (c,) = hb.consumers
    assert (c.consume_type, c.message_model, c.consume_from_where) == (
        ConsumeType.CONSUME_PASSIVELY,
        MessageModel.CLUSTERING,
        ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
    )
    assert [(s.topic, s.sub_version) for s in c.subscriptions] == [("T", 1566), ("%RETRY%G", 1567)]
    # and it survives our own encoding (Java-style enum names are accepted too)
    assert bodies.parse_heartbeat(bodies.heartbeat_body(hb)) == hb
    java = dict(
        CPP_HEARTBEAT,
        consumerDataSet=[dict(CPP_HEARTBEAT["consumerDataSet"][0], consumeType="CONSUME_ACTIVELY")],
    )
    assert (
        bodies.parse_heartbeat(json.dumps(java).encode()).consumers[0].consume_type
        is ConsumeType.CONSUME_ACTIVELY
    )


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b"{}",
        b'{"clientID": "x", "consumerDataSet": {}}',
        b'{"clientID":"x","consumerDataSet":[{"messageModel":7}]}',
    ],
)
def test_bad_heartbeats_are_typed_errors(body: bytes) -> None:
    with pytest.raises(HeaderFieldError):
        bodies.parse_heartbeat(body)


def test_lock_body_round_trip() -> None:
    mqs = {MessageQueue("T", "broker-a", i) for i in range(3)}
    assert bodies.parse_lock_body(bodies.lock_body("G", "cid", mqs)) == ("G", "cid", mqs)
    with pytest.raises(HeaderFieldError):
        bodies.parse_lock_body(b'{"consumerGroup":"G","clientId":"c","mqSet":[{"topic":"T"}]}')


entries = st.lists(
    st.builds(
        BatchEntry,
        body=st.binary(max_size=100),
        properties=st.dictionaries(
            st.text(
                st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
                min_size=1,
                max_size=8,
            ),
            st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]), max_size=8),
            max_size=3,
        ),
        flag=st.integers(-(2**31), 2**31 - 1),
    ),
    min_size=1,
    max_size=5,
)


@given(entries)
def test_batch_round_trip(batch: list[BatchEntry]) -> None:
    assert bodies.decode_batch(bodies.encode_batch(batch)) == batch


@given(st.binary(max_size=200))
def test_batch_decoder_rejects_garbage_with_typed_errors(junk: bytes) -> None:
    with contextlib.suppress(HeaderFieldError):
        bodies.decode_batch(junk)


def _record(topic: str, body: bytes, queue_offset: int, phys: int) -> bytes:
    msg = MessageInner(topic=topic, body=body, queue_id=2, properties={"UNIQ_KEY": f"U{phys}", "KEYS": "a b"})
    return encode_record(msg, queue_offset, phys, 1_700_000_000_000, host_bytes(("10.1.2.3", 10911)))


def test_records_decode_and_store_host_is_rewritten() -> None:
    raw = _record("T", b"hello", 7, 0) + _record("T", b"world!", 8, 200)
    patched = with_store_host(raw, "127.0.0.1:40000")
    msgs = decode_records(patched, broker_name="broker-a")
    assert [(m.body, m.queue_offset, m.commit_log_offset, m.store_host) for m in msgs] == [
        (b"hello", 7, 0, "127.0.0.1:40000"),
        (b"world!", 8, 200, "127.0.0.1:40000"),
    ]
    assert msgs[0].msg_id == "U0" and msgs[1].key_list == ["a", "b"]
    # STOREHOST read from raw bytes at offset 64 (reference §E), independent of our decoder
    assert patched[64:72] == bytes([127, 0, 0, 1]) + struct.pack(">i", 40000)


@pytest.mark.parametrize("cut", [1, 50, 90, 100])
def test_truncated_records_raise(cut: int) -> None:
    raw = _record("T", b"hello", 7, 0)
    with pytest.raises(RecordError):
        list(split_records(raw[:cut]))
