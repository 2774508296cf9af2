"""A broker bound to every interface (``--host 0.0.0.0``, as in a container) registers an address others can
connect to — never ``0.0.0.0`` — for its clients (brokerIP1), its slaves (the HA port) and, through its
runtime info, other groups' 5.x front ends. ``--announce-host`` names that address explicitly."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from broker_sim.client.producer import Producer
from broker_sim.common.message import Message, SendStatus
from broker_sim.common.net import WILDCARD_HOSTS, announce_host, local_address
from broker_sim.remoting.client_transport import RemotingTransport
from broker_sim.remoting.serve import BrokerSimServer, ServeConfig

TOPIC = "AnnounceT"


def serve_on_all_interfaces(tmp_path: Path, announce: str | None) -> BrokerSimServer:
    server = BrokerSimServer(
        ServeConfig(
            store_dir=tmp_path / "store",
            host="0.0.0.0",
            namesrv_port=0,
            broker_port=0,
            announce_host=announce,
            broker_config={"topics": {TOPIC: 2}, "ha_listen_port": 0},
        )
    )
    server.start()
    return server


def registered_broker_address(namesrv: str) -> str:
    transport = RemotingTransport(namesrv)
    try:
        (broker,) = transport.get_route(TOPIC).broker_datas
        return broker.broker_addrs[0]
    finally:
        transport.close()


def test_the_local_address_belongs_to_this_machine() -> None:
    """What a wildcard bind announces by default is an address of this machine (a socket can bind it)."""
    host = local_address()
    assert host not in WILDCARD_HOSTS
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))


@pytest.mark.parametrize(
    ("bind", "explicit", "expected"),
    [("0.0.0.0", "broker-a.internal", "broker-a.internal"), ("127.0.0.1", None, "127.0.0.1")],
)
def test_an_explicit_announce_host_wins_and_a_specific_bind_host_is_announced_as_is(
    bind: str, explicit: str | None, expected: str
) -> None:
    assert announce_host(bind, explicit) == expected


@pytest.mark.parametrize("announce", [None, "127.0.0.1"])
def test_a_broker_bound_to_all_interfaces_registers_a_reachable_address(
    tmp_path: Path, announce: str | None
) -> None:
    server = serve_on_all_interfaces(tmp_path, announce)
    try:
        expected = announce or local_address()
        namesrv = f"{expected}:{server.namesrv_server.port}"
        address = registered_broker_address(namesrv)
        host, _, port = address.rpartition(":")
        assert host == expected and int(port) == server.broker_server.port
        assert server.broker is not None
        ha_host, _, ha_port = server.broker.store.replication.ha_address.rpartition(":")
        assert ha_host == expected
        socket.create_connection((ha_host, int(ha_port)), timeout=5).close()
        producer = Producer(namesrv, "AnnounceP")
        try:
            assert (
                producer.send(Message(TOPIC, b"through the announced address")).status is SendStatus.SEND_OK
            )
        finally:
            producer.shutdown()
    finally:
        server.shutdown()
