"""A whole cluster as child processes — one name server, and per broker group a master and its slaves, each
broker its own process so a test (or ``broker-sim serve --brokers 2 --slaves 1``) can kill one.

Every port is chosen up front, so a killed broker restarts on the same broker and HA ports: its slaves
reconnect to the same HA address and clients find it where the name server says. The ports are free loopback
ports outside the kernel's ephemeral range (:func:`broker_sim.common.net.listen_port`), so no connection of
the cluster itself can take one before its server binds it, or while a killed broker is down.
Brokers start with ``--fault-signals`` (SIGUSR1 = power cut, see :mod:`broker_sim.remoting.serve`) and
``--exit-with-parent``.
"""

from __future__ import annotations

import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_sim.common.net import listen_port
from broker_sim.remoting.serve_process import ServeProcess


@dataclass
class BrokerNode:
    name: str
    broker_id: int
    role: str
    port: int
    ha_port: int
    process: ServeProcess

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


class ClusterProcess:
    def __init__(
        self,
        base: Path,
        *,
        brokers: int = 2,
        slaves: int = 1,
        replication: str = "async",
        flush: str = "ASYNC_FLUSH",
        extra: tuple[str, ...] = (),
        log_level: str = "WARNING",
        stderr_path: Path | None = None,
    ) -> None:
        if brokers < 1 or slaves < 0:
            raise ValueError("a cluster needs at least one broker group and no negative slave count")
        if replication not in ("sync", "async"):
            raise ValueError(f"replication must be sync or async, got {replication!r}")
        self.base = base
        self.namesrv_port = listen_port()
        self.namesrv_process = ServeProcess(
            base, "--exit-with-parent", command="namesrv", log_level=log_level, stderr_path=stderr_path
        )
        master_role = "SYNC_MASTER" if replication == "sync" else "ASYNC_MASTER"
        self.nodes: list[BrokerNode] = []
        for g in range(brokers):
            name = f"broker-{chr(ord('a') + g)}"
            for bid in range(slaves + 1):
                role = master_role if bid == 0 else "SLAVE"
                port, ha_port = listen_port(), listen_port()
                args = [
                    "--namesrv", self.namesrv, "--name", name, "--id", str(bid), "--role", role,
                    "--flush", flush, "--fault-signals", "--exit-with-parent", *extra,
                ]  # fmt: skip
                if bid == 0:
                    args += ["--ha-port", str(ha_port)]
                else:
                    args += ["--master-ha", f"127.0.0.1:{self.nodes[-bid].ha_port}"]
                proc = ServeProcess(
                    base / f"{name}-{bid}",
                    *args,
                    log_level=log_level,
                    stderr_path=stderr_path,
                    command="broker",
                )
                self.nodes.append(BrokerNode(name, bid, role, port, ha_port, proc))

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    def node(self, name: str, broker_id: int = 0) -> BrokerNode:
        for n in self.nodes:
            if n.name == name and n.broker_id == broker_id:
                return n
        raise KeyError(f"no broker {name} id {broker_id}")

    def start(self) -> ClusterProcess:
        self.namesrv_process.start(namesrv_port=self.namesrv_port, attempts=3)
        for n in self.nodes:
            n.process.start(broker_port=n.port, attempts=3)
        return self

    def power_cut(self, name: str, broker_id: int = 0) -> int:
        """Cut one broker's power (unflushed data lost); returns its exit code."""
        return self.node(name, broker_id).process.stop(signal.SIGUSR1)

    def restart(self, name: str, broker_id: int = 0) -> None:
        n = self.node(name, broker_id)
        n.process.start(broker_port=n.port, attempts=5)

    def stop(self) -> None:
        for proc in [*(n.process for n in reversed(self.nodes)), self.namesrv_process]:
            if proc.proc is not None and proc.proc.poll() is None:
                proc.stop()
            proc.kill()

    def __enter__(self) -> ClusterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_cluster(store: Path, **options: Any) -> None:
    """Run a :class:`ClusterProcess` until SIGTERM/SIGINT (``broker-sim serve --brokers N --slaves M``):
    one ready line on stdout (``broker-sim ready namesrv=… broker=<first master> nodes=name/id=addr,…``)."""
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda signum, frame: stop.set())
    store.mkdir(parents=True, exist_ok=True)
    with ClusterProcess(store, **options) as cluster:
        nodes = ",".join(f"{n.name}/{n.broker_id}={n.address}" for n in cluster.nodes)
        print(f"broker-sim ready namesrv={cluster.namesrv} broker={cluster.nodes[0].address} nodes={nodes}")
        sys.stdout.flush()
        stop.wait()
