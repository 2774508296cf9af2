"""A pull answered while the message store stops under the broker (a power cut, a shutdown).

The broker checks that it runs before a pull; the store can still stop between that check and the read. The
read's ``StoreNotRunningError`` went out as SYSTEM_ERROR, and the TCP server logged it at ERROR with a
traceback at every power cut of the chaos demo. RocketMQ answers a broker that is going away with
SERVICE_NOT_AVAILABLE (14), which the client takes as "try another broker later", as here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_sim import Broker
from broker_sim.common.errors import ServiceNotAvailableError
from broker_sim.common.requests import PullMessageRequest, ResponseCode


def test_a_pull_the_stopped_store_cannot_serve_is_answered_service_not_available(tmp_path: Path) -> None:
    broker = Broker(str(tmp_path / "store"), topics={"T": 1})
    broker.start()
    try:
        broker.store.shutdown()  # the store stops, the broker has not noticed yet
        req = PullMessageRequest("g", "T", 0, 0, max_msg_nums=1, suspend_timeout_ms=0)
        with pytest.raises(ServiceNotAvailableError) as info:
            broker.pull_message_async(req, lambda result: None)
        assert info.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
    finally:
        broker.shutdown()
