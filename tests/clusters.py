"""Clusters of name servers and brokers inside the test process (each a ``BrokerSimServer`` on
free loopback ports, wired as ``broker-sim namesrv`` / ``broker-sim broker`` wire them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker_sim.remoting.serve import BrokerSimServer, ServeConfig


@dataclass
class Cluster:
    base: Path
    namesrvs: list[BrokerSimServer] = field(default_factory=list)
    brokers: dict[str, BrokerSimServer] = field(default_factory=dict)
    #: the host every server binds (``0.0.0.0``: all interfaces, each announcing this machine's address)
    host: str = "127.0.0.1"

    @property
    def namesrv_addrs(self) -> list[str]:
        return [n.namesrv_address for n in self.namesrvs]

    def add_namesrv(self) -> BrokerSimServer:
        srv = BrokerSimServer(
            ServeConfig(store_dir=self.base, host=self.host, namesrv_port=0, run_broker=False)
        )
        srv.start()
        self.namesrvs.append(srv)
        return srv

    def add_broker(self, name: str, *, grpc: bool = False, **config: Any) -> BrokerSimServer:
        """A broker group's master; with ``grpc`` its own 5.x front end too (``.grpc.address``)."""
        srv = BrokerSimServer(
            ServeConfig(
                store_dir=self.base / name,
                host=self.host,
                broker_port=0,
                broker_name=name,
                run_namesrv=False,
                namesrv_addrs=self.namesrv_addrs,
                broker_config=config,
                grpc_port=0 if grpc else None,
            )
        )
        srv.start()
        self.brokers[name] = srv
        return srv

    def shutdown(self) -> None:
        for s in [*self.brokers.values(), *self.namesrvs]:
            s.shutdown()


ClusterFactory = Callable[..., Cluster]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterFactory]:
    """``cluster(namesrvs=1, brokers=("broker-a", "broker-b"), grpc=False, host="127.0.0.1", **config)``:
    ``config`` is every broker's configuration."""
    made: list[Cluster] = []

    def factory(
        namesrvs: int = 1,
        brokers: tuple[str, ...] = ("broker-a", "broker-b"),
        grpc: bool = False,
        host: str = "127.0.0.1",
        **config: Any,
    ) -> Cluster:
        c = Cluster(tmp_path / f"cluster{len(made)}", host=host)
        made.append(c)
        for _ in range(namesrvs):
            c.add_namesrv()
        for name in brokers:
            c.add_broker(name, grpc=grpc, **config)
        return c

    yield factory
    for c in made:
        c.shutdown()
