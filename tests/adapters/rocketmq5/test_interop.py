"""One store, two protocols: ``broker-sim serve --grpc-port`` with the 4.x C++ client (PyPI ``rocketmq``
0.4.4, this venv) on the remoting port and the official 5.x client (its own venv) on the gRPC port. A
message sent through either front end is consumed through the other, body and keys intact."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_sim.common.net import listen_port
from reliable.demo.services import BrokerServer, wait_port
from tests.adapters.rocketmq5.conftest import Client5
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
TOPIC = "Interop5"


@pytest.fixture
def served(rmq5_python: Path, tmp_path: Path) -> Iterator[tuple[BrokerServer, str]]:
    grpc_port = listen_port()
    srv = BrokerServer(
        tmp_path / "store", tmp_path / "logs",
        ["--grpc-port", str(grpc_port), "--set", f"topics={json.dumps({TOPIC: 2})}",
         "--log-level", "WARNING"],
    )  # fmt: skip
    srv.start()
    assert srv.process is not None
    wait_port(grpc_port, srv.process.proc, "broker-sim serve (gRPC)")
    yield srv, f"127.0.0.1:{grpc_port}"
    srv.stop()


def test_5x_producer_to_4x_consumer_and_4x_producer_to_5x_consumer(
    served: tuple[BrokerServer, str], rmq5_python: Path, tmp_path: Path
) -> None:
    from rocketmq.client import Message, Producer, PushConsumer

    server, endpoint = served
    five = Client5(rmq5_python, endpoint, tmp_path)
    received4: dict[str, bytes] = {}
    lock = threading.Lock()

    def on_message(msg: Any) -> None:  # returning normally = CONSUME_SUCCESS in 0.4.4
        with lock:
            received4[msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys] = msg.body

    consumer4 = PushConsumer("interop_g4")
    consumer4.set_namesrv_addr(server.address)
    consumer4.subscribe(TOPIC, on_message)
    consumer4.start()
    producer4 = Producer("interop_p4")
    producer4.set_namesrv_addr(server.address)
    producer4.start()
    try:
        five.call("producer", topics=[TOPIC])
        for i in range(3):
            five.call("send", topic=TOPIC, body=f"from-5-{i}", keys=f"k5-{i}", tag="five")
        wait_until(lambda: len(received4) >= 3, timeout=60, what="the 4.x consumer to get the 5.x messages")
        assert received4 == {f"k5-{i}": f"from-5-{i}".encode() for i in range(3)}

        for i in range(3):
            m = Message(TOPIC)
            m.set_keys(f"k4-{i}")
            m.set_tags("four")
            m.set_body(f"from-4-{i}")
            producer4.send_sync(m)
        five.call("simple", group="interop_g5", topic=TOPIC, await_s=1, tag="four")
        got: dict[str, dict[str, Any]] = {}

        def more() -> bool:
            for m5 in five.call("receive", max=16, invisible_s=30)["messages"]:
                got[m5["keys"][0]] = m5
                five.call("ack", handle=m5["handle"])
            return len(got) >= 3

        wait_until(more, timeout=60, what="the 5.x consumer to get the 4.x messages")
        assert {k: m5["body"] for k, m5 in got.items()} == {f"k4-{i}": f"from-4-{i}" for i in range(3)}
        assert all(m5["tag"] == "four" and m5["attempt"] == 1 for m5 in got.values())
    finally:
        five.close()
        producer4.shutdown()
        consumer4.shutdown()
