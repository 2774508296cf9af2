"""Fixtures: a ``broker-sim serve`` equivalent (name server + broker over TCP) inside the test process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from broker_sim.remoting.serve import BrokerSimServer, ServeConfig

if TYPE_CHECKING:
    from broker_sim.broker.broker import Broker

FAST_DELAYS = " ".join(["1s"] * 18)  # every retry level 1 s, so retry/DLQ tests finish in seconds

ServerFactory = Callable[..., BrokerSimServer]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServerFactory]:
    """``serve(**broker_config)`` starts a server on free loopback ports; all are shut down after the test."""
    started: list[BrokerSimServer] = []

    def factory(
        store: Path | None = None, acl: dict[str, str] | None = None, **config: Any
    ) -> BrokerSimServer:
        server = BrokerSimServer(
            ServeConfig(
                store_dir=store or tmp_path / f"store{len(started)}",
                namesrv_port=0,
                broker_port=0,
                acl_accounts=acl or {},
                broker_config=config,
            )
        )
        server.start()
        started.append(server)
        return server

    yield factory
    for s in started:
        s.shutdown()


def running_broker(server: BrokerSimServer) -> Broker:
    """The broker a started server runs in this process (every server these tests start runs one)."""
    assert server.broker is not None
    return server.broker
