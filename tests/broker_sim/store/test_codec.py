"""The compiled append path (``broker_sim.store._codec``) and its pure-Python twin (``codec.py``) behave the
same record by record: equal bytes, tuples and exceptions for any message, equal CRCs, equal dispatch runs
and hint takes (hypothesis). The store-level comparisons are in ``test_codec_store.py``."""

from __future__ import annotations

import zlib
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_sim.store import (
    MessageInner,
    codec,
)
from broker_sim.store.codec import TAGS_UNKNOWN, DispatchHint
from broker_sim.store.config import SCHEDULE_TOPIC
from broker_sim.store.message_record import decode_record, encode_record, host_bytes
from tests.broker_sim.store.conftest import needs_c

REPO = Path(__file__).resolve().parents[3]
STORE_HOST = host_bytes(("192.168.1.9", 10911))

topics = st.one_of(st.from_regex(r"\A[%|a-zA-Z0-9_-]{1,130}\Z"), st.sampled_from(["", " ", "bad topic", "Ü"]))
text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12)  # \x01, \x02 and all
# values long enough that the compiled encoder's 256-byte properties buffer fills part-way through the dict
# (entries after that are checked and written by a second walk), separators placed on either side of that
# point, and "TAGS" also as an equal str that is another object
long_text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=60, max_size=260)
values = st.one_of(text, long_text, st.sampled_from(["a\x01b", "\x02", "x" * 250 + "\x01", "TagA"]))
props = st.dictionaries(
    st.one_of(text, st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "".join(["TA", "GS"]), "k\x02"])),
    values,
    max_size=6,
)
ints = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**64), 2**64))
hosts = st.one_of(
    st.tuples(st.sampled_from(["10.0.0.7", "127.0.0.1", "255.255.255.255"]), st.integers(0, 2**31 - 1)),
    st.tuples(st.sampled_from(["::1", "nope", "10.0.0.7"]), st.integers(-5, 2**32)),
    # what libc's inet_aton (socket.inet_aton's, and the compiled packer's) accepts or refuses
    st.tuples(
        st.sampled_from(
            [
                "127.1",
                "0x7f.0.0.1",
                "010.0.0.1",
                "4294967295",
                "10.0.0.7 x",
                " 10.0.0.7",
                "1.2.3.4\x00",
                "256.1.1.1",
                "Ü",
                "",
            ]
        ),
        st.integers(0, 2**31 - 1),
    ),
    st.builds(lambda ip, port: [ip, port], st.just("10.0.0.7"), st.sampled_from([1, True])),
)
messages = st.builds(
    MessageInner,
    topic=topics,
    body=st.binary(max_size=3000),
    queue_id=st.one_of(st.integers(0, 40), st.integers(-(2**32), 2**32)),
    flag=ints,
    properties=props,
    sys_flag=st.sampled_from([0, 0x1, 0x2, 0x4, 0x8, 0xC, 0x10, 0x20, -1, 2**31]),
    born_timestamp=st.one_of(st.integers(0, 2**45), st.integers(-(2**64), 2**64)),
    born_host=hosts,
    store_host=st.one_of(st.none(), hosts),
    reconsume_times=ints,
    prepared_transaction_offset=st.one_of(st.integers(0, 2**40), st.integers(-(2**64), 2**64)),
)


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except Exception as exc:  # the two twins must fail the same way, whatever the exception
        return type(exc).__name__, str(exc)


@needs_c
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    msg=messages, max_size=st.sampled_from([4 * 1024 * 1024, 1000]), file_size=st.sampled_from([2**30, 1200])
)
def test_compiled_prepare_equals_python(msg: MessageInner, max_size: int, file_size: int) -> None:
    c_cache: dict[str, bytes] = {}
    py_cache: dict[str, bytes] = {}
    c = outcome(codec.compiled.prepare, msg, STORE_HOST, c_cache, max_size, file_size)
    py = outcome(codec.py_prepare, msg, STORE_HOST, py_cache, max_size, file_size)
    assert c == py
    assert c_cache == py_cache
    if c[0] == "ok":  # again, now from the topic cache
        assert codec.compiled.prepare(msg, STORE_HOST, c_cache, max_size, file_size) == py[1]


@needs_c
@pytest.mark.parametrize(
    "properties",
    [
        {"KEYS": "k" * 300, "TAGS": "TagB"},  # TAGS after the entry that overflows the buffer
        {"TAGS": "TagB", "KEYS": "k" * 300, "A": "b"},
        {"A": "x" * 240, "B": "y" * 20, "TAGS": "t"},  # the second entry is the first that does not fit
        {"A": "x" * 250, "TAGS": "t\x01"},  # a separator after the buffer filled
        {"TAGS": "t\x02", "A": "x" * 250},  # ... and before
        {"A\x01": "b", "TAGS": "t"},
        {"A": "x" * 252},  # exactly the buffer: "A" + 1 + 252 + 2 = 256
        {"A": "x" * 253},  # one byte past it
        {"Ü": "ß" * 200, "TAGS": "TagC"},  # non-ASCII: UTF-8 lengths, not character counts
    ],
)
def test_compiled_prepare_equals_python_on_long_properties(properties: dict[str, str]) -> None:
    """The compiled encoder copies properties into a 256-byte buffer on its one walk and writes the rest
    with a second walk: record bytes, TAGS and raw properties match the Python encoder on both sides."""
    msg = MessageInner("T", b"body", properties=properties, born_host=("10.0.0.7", 5555))
    topic_fields: dict[str, bytes] = {}
    args = (msg, STORE_HOST, topic_fields, 4 * 1024 * 1024, 2**30)
    assert codec.compiled.prepare(*args) == codec.py_prepare(*args)


@settings(max_examples=200, deadline=None)
@given(
    msg=st.builds(
        MessageInner,
        topic=st.from_regex(r"\A[a-zA-Z0-9_-]{1,40}\Z"),
        body=st.binary(max_size=2000),
        queue_id=st.integers(0, 2**31 - 1),
        flag=st.integers(-(2**31), 2**31 - 1),
        properties=st.dictionaries(
            st.text(
                alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
                min_size=1,
                max_size=8,
            ),
            st.text(
                alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
                max_size=8,
            ),
            max_size=5,
        ),
        sys_flag=st.sampled_from([0, 0x8]),
        born_timestamp=st.integers(0, 2**45),
        born_host=st.just(("10.0.0.7", 5555)),
    ),
    impl=st.sampled_from(["c", "python"]),
    qoff=st.integers(0, 2**40),
    now=st.integers(0, 2**45),
)
def test_placed_record_decodes_to_the_message(msg: MessageInner, impl: str, qoff: int, now: int) -> None:
    """Encode with either twin, place into a mapped segment, decode: every field comes back, and the bytes
    equal those of the independent reference encoder (``encode_record``, held to RocketMQ's layout by the
    fidelity tests)."""
    if impl == "c" and codec.compiled is None:
        return
    c = codec.implementation(impl)
    p = c.prepare(msg, STORE_HOST, {}, 4 * 1024 * 1024, 2**30)
    record = bytearray(p[0])
    record[20:36] = qoff.to_bytes(8, "big") + (12345).to_bytes(8, "big")
    record[56:64] = now.to_bytes(8, "big")
    assert bytes(record) == encode_record(msg, qoff, 12345, now, STORE_HOST)
    ext = decode_record(record)
    assert (ext.topic, ext.body, ext.queue_id, ext.flag, ext.properties, ext.sys_flag) == (
        msg.topic, msg.body, msg.queue_id, msg.flag, msg.properties, msg.sys_flag,
    )  # fmt: skip
    assert (ext.queue_offset, ext.commit_log_offset, ext.store_timestamp, ext.born_host) == (
        qoff, 12345, now, msg.born_host,
    )  # fmt: skip
    assert ext.body_crc == zlib.crc32(msg.body) & 0x7FFFFFFF


@needs_c
@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=5000))
def test_compiled_crc_equals_zlib(data: bytes) -> None:
    assert codec.compiled.crc32(data) == zlib.crc32(data)


hints = st.lists(
    st.tuples(
        st.integers(0, 50),  # queue-offset step (0 = repeat, >1 = gap)
        # a topic built afresh is equal to, but not the same object as, the other hints' topic (a producer
        # decoding each request): the compiled grouping must still put both in one queue's run
        st.sampled_from(["TopicA", "TopicB", SCHEDULE_TOPIC]).flatmap(
            lambda t: st.sampled_from([t, "".join(list(t))])
        ),
        st.one_of(st.integers(0, 2), st.integers(0, 40)),  # many queues: the run table's collisions
        st.sampled_from([0, 0x4, 0x8, 0xC]),
        st.one_of(st.none(), st.sampled_from(["", "TagA", "Ü𝄞", TAGS_UNKNOWN])),
    ),
    max_size=60,
)


def as_hints(spec: list[tuple[int, str, int, int, str | None]]) -> list[DispatchHint]:
    out: list[DispatchHint] = []
    phys, qoffs = 0, dict[tuple[str, int], int]()
    for step, topic, qid, sys_flag, tags in spec:
        qoff = qoffs.get((topic, qid), 0) + (1 if step == 1 else step % 3)
        qoffs[(topic, qid)] = qoff
        size = 100 + step
        out.append(
            (phys, phys, size, topic, qid, qoff, 1_700_000_000_000 + step, sys_flag, 0, tags, b"D\x012")
        )
        phys += size
    return out


@needs_c
@settings(max_examples=300, deadline=None)
@given(spec=hints, all_special=st.booleans(), build_cq=st.booleans())
def test_compiled_build_runs_equals_python(
    spec: list[tuple[int, str, int, int, str | None]], all_special: bool, build_cq: bool
) -> None:
    batch = as_hints(spec)

    def special(h: DispatchHint) -> int:
        return h[6] * 7 + h[4]

    assert codec.compiled.build_runs(batch, special, all_special, build_cq) == codec.py_build_runs(
        batch, special, all_special, build_cq
    )


@needs_c
@settings(max_examples=200, deadline=None)
@given(spec=hints, cut=st.integers(0, 70), start=st.integers(0, 300), limit=st.integers(0, 70))
def test_compiled_take_hints_equals_python(
    spec: list[tuple[int, str, int, int, str | None]], cut: int, start: int, limit: int
) -> None:
    batch = as_hints(spec)
    end = batch[min(cut, len(batch) - 1)][1] + 100 if batch else 0
    c_deque, py_deque = deque(batch), deque(batch)
    assert codec.compiled.take_hints(c_deque, start, end, limit) == codec.py_take_hints(
        py_deque, start, end, limit
    )
    assert c_deque == py_deque
