"""The client-side fault machinery of the demo, against real servers: broker_sim (in-process) and Redis."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis as redis_lib

from broker_sim.broker.api import SendMessageRequest
from broker_sim.client.errors import RequestTimeoutError, SendFailedError
from broker_sim.client.message import Message
from broker_sim.client.producer import Producer
from reliable.demo.netproxy import TcpRelay
from reliable.demo.transport import ChaosTransport

TOPIC = "FaultT"


def eventually(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``cond`` (the broker builds its consume queues asynchronously) until true or the deadline."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(0.02)
    return True


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[object]:
    from broker_sim.broker.broker import Broker

    b = Broker(str(tmp_path / "store"), topics={TOPIC: 2}, commit_log_file_size=4 << 20)
    b.start()
    yield b
    b.shutdown()


def test_lost_send_ack_stores_the_message_but_fails_the_send(broker: object) -> None:
    chaos = ChaosTransport.wrap(broker)
    chaos.lose_send_acks(1)
    request = SendMessageRequest(producer_group="p", topic=TOPIC, queue_id=0)
    with pytest.raises(RequestTimeoutError):
        chaos.send_message(request, b"first")
    assert eventually(lambda: chaos.get_max_offset(TOPIC, 0) == 1)  # stored although the send "failed"
    chaos.send_message(request, b"second")  # armed for one only
    assert eventually(lambda: chaos.get_max_offset(TOPIC, 0) == 2)
    assert chaos.acks_lost == 1


def test_broker_sim_producer_does_not_retry_a_lost_ack(broker: object) -> None:
    """As RocketMQ 4.9.8's DefaultMQProducerImpl.sendDefaultImpl: a lost ACK spends the shared send budget,
    so the send fails without a retry although the message is stored once (the stub stays PENDING and the
    sweeper's resend is what makes the second copy)."""
    chaos = ChaosTransport.wrap(broker)
    admin = ChaosTransport.wrap(broker)  # the producer closes its transport at shutdown
    producer = Producer(chaos.as_transport(), "p2")
    try:
        chaos.lose_send_acks(1)
        with pytest.raises(SendFailedError):
            producer.send(Message(TOPIC, b"x", keys="k-1"))
    finally:
        producer.shutdown()
    assert eventually(lambda: admin.get_max_offset(TOPIC, 0) + admin.get_max_offset(TOPIC, 1) == 1)


def test_lost_offset_commits_are_dropped_for_a_while(broker: object) -> None:
    chaos = ChaosTransport.wrap(broker)
    chaos.update_consumer_offset("g", TOPIC, 0, 5)
    chaos.lose_offset_commits(60)
    chaos.update_consumer_offset("g", TOPIC, 0, 9)
    assert chaos.query_consumer_offset("g", TOPIC, 0) == 5
    assert chaos.commits_dropped == 1


def test_relay_outage_refuses_then_recovers(redis_url: str) -> None:
    parsed = urlsplit(redis_url)
    relay = TcpRelay((parsed.hostname or "127.0.0.1", parsed.port or 6379))
    relay.start()
    try:
        client = redis_lib.Redis(
            host="127.0.0.1", port=relay.port, socket_timeout=2, socket_connect_timeout=1
        )
        assert client.ping()
        outage = threading.Thread(target=relay.outage, args=(60,))
        outage.start()
        # Wait for the cut itself (connecting in a loop until refused floods the relay with connections
        # before the cut, and on a loaded machine its accept queue fills and a connect times out instead).
        assert relay.refusing.wait(10), "the outage did not begin"
        with pytest.raises(ConnectionRefusedError):  # a raw connect: redis-py would retry until it is over
            socket.create_connection(("127.0.0.1", relay.port), timeout=5).close()
        relay.resume()
        outage.join(10)
        assert not outage.is_alive() and not relay.refusing.is_set()
        assert client.ping()  # the client reconnects once the relay listens again
        client.close()
    finally:
        relay.stop()
