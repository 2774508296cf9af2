"""5.x protobuf message → broker_sim store → 5.x protobuf message keeps what a consumer reads.

The generated protocol modules come from the 5.x venv (``rmq5_python`` points the loader at them)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_sim import Broker
from broker_sim.common.convert import to_client
from broker_sim.grpc.convert import IllegalPropertyError, to_pb_message, to_send_request
from broker_sim.grpc.protocol import Protocol, load_protocol
from tests.broker_sim.messaging.conftest import SMALL_STORE

TOPIC = "Conv5"
#: printable ASCII without the 4.x property separators (\x01 \x02), the KEYS separator and the tag "||"
_chars = st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="|")
names = st.text(_chars, min_size=1, max_size=12)


@pytest.fixture(scope="module")
def pb(rmq5_python: Path) -> Protocol:
    return load_protocol()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = Broker(tmp_path_factory.mktemp("conv") / "store", topics={TOPIC: 2}, **SMALL_STORE).start()
    yield b
    b.shutdown()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.binary(min_size=1, max_size=300),
    tag=st.none() | names,
    keys=st.lists(names, max_size=3, unique=True),
    props=st.dictionaries(names.filter(lambda k: k.isalnum() and k.islower()), names, max_size=3),
    group=st.none() | names,
)
def test_a_message_keeps_its_fields_through_the_store(
    pb: Protocol, broker: Broker, body: bytes, tag: str | None, keys: list[str], props: dict[str, str],
    group: str | None,
) -> None:  # fmt: skip
    d = pb.definition
    m: Any = d.Message()
    m.topic.name = TOPIC
    m.body = body
    m.user_properties.update(props)
    sp = m.system_properties
    sp.message_id = "01" + zlib.crc32(body).to_bytes(4, "big").hex().upper()
    sp.message_type = d.FIFO if group else d.NORMAL
    sp.born_host = "10.1.2.3"
    sp.born_timestamp.seconds = 1_700_000_000
    if tag:
        sp.tag = tag
    sp.keys.extend(keys)
    if group:
        sp.message_group = group
    req, stored_body, deliver = to_send_request(pb, m, 1)
    assert deliver is None
    sent = broker.send_message(req, stored_body)
    broker.store.wait_dispatched(5.0)
    r = broker.store.get_message("conv", TOPIC, 1, sent.queue_offset, 1, None)
    back = to_pb_message(pb, to_client(r.messages[0].ext, "broker-a"))
    bsp = back.system_properties
    assert (back.topic.name, back.body, dict(back.user_properties)) == (TOPIC, body, props)
    assert (bsp.message_id, bsp.tag, sorted(bsp.keys), bsp.message_group) == (
        sp.message_id, tag or "", sorted(keys), group or "")  # fmt: skip
    assert bsp.message_type == sp.message_type
    assert bsp.body_digest.checksum == format(zlib.crc32(body) & 0xFFFFFFFF, "08X")
    assert (bsp.queue_id, bsp.queue_offset) == (1, sent.queue_offset)
    assert bsp.born_timestamp.seconds == 1_700_000_000


@pytest.mark.parametrize(
    ("name", "value"),
    [("KEYS", "spoofed-1"), ("DELAY", "18"), ("__SHARDINGKEY", "g"), ("UNIQ_KEY", "x"), ("ok", "a\x01KEYS")],
)
def test_a_user_property_the_broker_keeps_for_itself_is_refused_as_a_proxy_does(
    pb: Protocol, name: str, value: str
) -> None:
    """A 5.x proxy refuses these with ILLEGAL_MESSAGE_PROPERTY_KEY; broker_sim stored them and acted on them:
    ``KEYS`` gave it another id, ``DELAY`` parked it for two hours, ``__SHARDINGKEY`` made it FIFO."""
    d = pb.definition
    m: Any = d.Message()
    m.topic.name = TOPIC
    m.body = b"x"
    m.user_properties[name] = value
    m.system_properties.message_id = "01AB"
    with pytest.raises(IllegalPropertyError):
        to_send_request(pb, m, 0)
