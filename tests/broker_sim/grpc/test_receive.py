"""ReceiveMessage long polls against a real gRPC front end, with raw calls (no 5.x client in between).

A consumer that goes away while its receive long-polls must not take the next message with it: a message
popped for a call nobody listens to stays invisible for its whole invisible duration while a live consumer
waits for it (a push consumer's renewal test once raced exactly this).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker_sim import Broker
from broker_sim.broker.api import SendMessageRequest
from broker_sim.client.message import Prop
from broker_sim.grpc.protocol import Protocol
from broker_sim.grpc.server import GrpcFrontEnd
from tests.adapters.rocketmq5.conftest import rmq5_python as rmq5_python  # the fixture
from tests.broker_sim.messaging.conftest import SMALL_STORE
from tests.waiting import wait_until

TOPIC, GROUP = "T", "g"


@pytest.fixture
def front(rmq5_python: Path, tmp_path: Path) -> Iterator[GrpcFrontEnd]:
    broker = Broker(tmp_path / "store", topics={TOPIC: 2}, **SMALL_STORE).start()
    fe = GrpcFrontEnd(broker, port=0).start()
    yield fe
    fe.stop()
    broker.shutdown()


def receive_request(pb: Protocol, long_polling_s: int) -> Any:
    req = pb.service.ReceiveMessageRequest()
    req.group.name = GROUP
    req.message_queue.topic.name = TOPIC
    req.batch_size = 1
    req.invisible_duration.seconds = 60
    req.long_polling_timeout.seconds = long_polling_s
    return req


def test_a_message_visible_after_a_receiving_client_went_away_goes_to_a_live_consumer(
    front: GrpcFrontEnd,
) -> None:
    """The message is sent only once the broker has seen the first client go, and is visible before the
    live consumer asks, so the only receive that could take it besides the live one is the gone one's
    call — still in its long-poll loop for up to one wake-up interval after its client left."""
    pb, service = front.pb, front.service
    gone = grpc.insecure_channel(front.address)
    waiting = pb.grpc.MessagingServiceStub(gone).ReceiveMessage(receive_request(pb, 20), timeout=30)
    wait_until(lambda: service.waiting_receives == 1, what="the receive to long-poll at the broker")
    gone.close()
    assert waiting.code() == grpc.StatusCode.CANCELLED
    wait_until(lambda: service.waiting_receives == 0, what="the broker to see the receiving client go")

    front.broker.send_message(
        SendMessageRequest("p", TOPIC, 0, properties={Prop.UNIQ_KEY: "m1"}), b"for a live consumer"
    )
    assert front.broker.store.wait_dispatched(10.0)  # visible now: a receive still polling is woken for it
    with grpc.insecure_channel(front.address) as live:
        replies = list(pb.grpc.MessagingServiceStub(live).ReceiveMessage(receive_request(pb, 5), timeout=30))
    got = [r.message.body for r in replies if r.WhichOneof("content") == "message"]
    assert got == [b"for a live consumer"], [str(r.status) for r in replies if r.HasField("status")]
