"""Record encoding: round trips (hypothesis), the layout read back with struct, properties, ids, hashes."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_sim.store import MessageIllegalError, MessageInner, codec
from broker_sim.store.message_record import (
    decode_msg_id,
    decode_properties,
    decode_record,
    encode_properties,
    encode_record,
    java_hash_concat,
    java_string_hash,
    offset_msg_id,
    verify_record,
)

STORE_HOST = bytes([192, 168, 1, 9]) + struct.pack(">i", 10911)
topics = st.from_regex(r"\A[%|a-zA-Z0-9_-]{1,127}\Z")
prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]), max_size=20
)
props = st.dictionaries(prop_text.filter(bool), prop_text, max_size=6)
ipv4 = st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255), st.integers(0, 255)).map(
    lambda t: ".".join(map(str, t))
)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)


def java_hash_reference(s: str) -> int:
    """The textbook loop over UTF-16 code units, to check the fast version against."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - 2**32 if h >= 2**31 else h


@settings(deadline=None)  # a busy CI box must not turn slowness into a failure
@given(
    topic=topics,
    body=st.binary(max_size=3000),
    properties=props,
    queue_id=st.integers(0, 2**31 - 1),
    flag=i32,
    sys_flag=st.sampled_from([0, 1, 2, 4, 8, 12]),
    born_ts=i64,
    born_ip=ipv4,
    born_port=st.integers(0, 65535),
    reconsume=i32,
    prepared=i64,
    qoff=i64,
    phys=st.integers(0, 2**62),
    store_ts=i64,
)
def test_record_round_trip(
    topic: str, body: bytes, properties: dict[str, str], queue_id: int, flag: int, sys_flag: int,
    born_ts: int, born_ip: str, born_port: int, reconsume: int, prepared: int, qoff: int, phys: int,
    store_ts: int,
) -> None:  # fmt: skip
    m = MessageInner(topic, body, queue_id, flag, properties, sys_flag, born_ts, (born_ip, born_port), None,
                     reconsume, prepared)  # fmt: skip
    raw = encode_record(m, qoff, phys, store_ts, STORE_HOST)
    topic_b = topic.encode()
    props_b = encode_properties(properties)
    assert len(raw) == 91 + len(body) + len(topic_b) + len(props_b)
    # the layout, read with struct here rather than through the decoder
    size, magic, crc, qid, fl, q, p, sf, bts = struct.unpack_from(">iIiiiqqiq", raw, 0)
    assert (size, magic, qid, fl, q, p) == (len(raw), 0xDAA320A7, queue_id, flag, qoff, phys)
    assert (sf, bts) == (sys_flag, born_ts)
    assert crc == zlib.crc32(body) & 0x7FFFFFFF
    assert raw[48:52] == bytes(int(x) for x in born_ip.split("."))
    assert struct.unpack_from(">iqi", raw, 52)[1] == store_ts
    assert raw[64:72] == STORE_HOST
    assert struct.unpack_from(">iqi", raw, 72) == (reconsume, prepared, len(body))
    assert raw[88 : 88 + len(body)] == body
    assert raw[88 + len(body)] == len(topic_b)
    assert verify_record(raw, 0, len(raw), phys) is None
    ext = decode_record(raw)
    assert (ext.topic, ext.body, ext.properties, ext.queue_id, ext.flag) == (
        topic,
        body,
        properties,
        queue_id,
        flag,
    )
    assert (ext.queue_offset, ext.commit_log_offset, ext.store_timestamp) == (qoff, phys, store_ts)
    assert ext.born_host == (born_ip, born_port)
    assert ext.store_host == ("192.168.1.9", 10911)
    assert (ext.reconsume_times, ext.prepared_transaction_offset, ext.sys_flag) == (
        reconsume,
        prepared,
        sys_flag,
    )


@settings(deadline=None)
@given(props)
def test_properties_round_trip(properties: dict[str, str]) -> None:
    raw = encode_properties(properties)
    assert decode_properties(raw) == properties
    # MessageDecoder.messageProperties2String (4.9.8): separators between pairs, none after the last
    assert raw.count(b"\x02") == max(0, len(properties) - 1)
    assert decode_properties(raw + b"\x02" if raw else raw) == properties  # the C++ client's trailing one


def test_properties_without_trailing_separator_as_java_writes_them() -> None:
    assert decode_properties(b"TAGS\x01a\x02KEYS\x01k1 k2") == {"TAGS": "a", "KEYS": "k1 k2"}


@settings(deadline=None)
@given(st.text(max_size=200))
def test_java_hash_matches_reference(s: str) -> None:
    assert java_string_hash(s) == java_hash_reference(s)


# the index hashes its keys with the compiled twin when the extension is built: both must give Java's value
CONCAT: list[tuple[str, Callable[[int, str], int]]] = [("python", java_hash_concat)]
if codec.compiled is not None:
    CONCAT.append(("c", codec.compiled.java_hash_concat))


@pytest.mark.parametrize("concat", [fn for _, fn in CONCAT], ids=[name for name, _ in CONCAT])
@settings(deadline=None)
@given(st.text(max_size=40), st.text(max_size=60))
def test_java_hash_of_a_concatenation(concat: Callable[[int, str], int], prefix: str, suffix: str) -> None:
    assert concat(java_string_hash(prefix), suffix) == java_hash_reference(prefix + suffix)


@pytest.mark.parametrize("concat", [fn for _, fn in CONCAT], ids=[name for name, _ in CONCAT])
def test_java_hash_of_index_keys(concat: Callable[[int, str], int]) -> None:
    prefix = java_string_hash("BenchTopic#")
    for key in ("7F0000010A2B18B4AAC2000000000123", "", "order-1", "clé", "key-\U0001f600", "k" * 300):
        assert concat(prefix, key) == java_hash_reference("BenchTopic#" + key)


def test_java_hash_known_values() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("polygenelubricants") == -2147483648


def test_offset_msg_id() -> None:
    mid = offset_msg_id(STORE_HOST, 0x1234)
    assert mid == "C0A8010900002A9F0000000000001234"
    assert decode_msg_id(mid) == (("192.168.1.9", 10911), 0x1234)
    with pytest.raises(MessageIllegalError):
        decode_msg_id("XYZ")


@pytest.mark.parametrize("topic", ["", " ", "a b", "topic/x", "t" * 128, "tópico"])
def test_bad_topics_raise(topic: str) -> None:
    with pytest.raises(MessageIllegalError):
        encode_record(MessageInner(topic, b"x"), 0, 0, 0, STORE_HOST)


def test_verify_detects_each_fault() -> None:
    raw = bytearray(encode_record(MessageInner("T", b"body", properties={"a": "b"}), 0, 100, 1, STORE_HOST))
    assert verify_record(bytes(raw), 0, len(raw), 100) is None
    assert verify_record(bytes(raw), 0, len(raw), 101) == "PHYSICALOFFSET disagrees with position"
    assert verify_record(bytes(raw), 0, len(raw) - 1, 100) == "size out of range"
    bad = bytearray(raw)
    bad[90] ^= 0xFF
    assert verify_record(bytes(bad), 0, len(bad), 100) == "body CRC mismatch"
    bad = bytearray(raw)
    bad[5] ^= 1
    assert verify_record(bytes(bad), 0, len(bad), 100) == "bad magic"
    bad = bytearray(raw)
    bad[92] = 50  # topic length
    assert verify_record(bytes(bad), 0, len(bad), 100) == "field lengths disagree with TOTALSIZE"
