"""Real Redis topologies for tests, started from the machine's ``redis-server`` on free loopback ports.

* :func:`redis_cluster` — three masters (no replicas) joined with ``redis-cli --cluster create``, every slot
  covered; yields the ``redis+cluster://`` URL and the node ports.
* :func:`redis_sentinel` — a master, a replica and one sentinel (quorum 1, 1 s down-after), so a test can
  kill the master and watch the replica be promoted; optionally without the replica (no wait for the
  sentinel to discover it) and with passwords on the master and the sentinel, each its own.

Every process belongs to the test and is killed at the end; data lives in a temporary directory. Waiting is
poll-with-timeout on the servers' own state (``CLUSTER INFO``, ``INFO replication``, the sentinel's view).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from broker_sim.common.net import listen_port
from tests import services
from tests.waiting import wait_until

SERVICE = "reliable-test"


def redis_server() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        services.unavailable("redis-server binary (apt-get install redis-server)")
    return str(binary)


def answering(check: Callable[[], bool]) -> Callable[[], bool]:
    """``check`` for :func:`tests.waiting.wait_until` while a server may still be starting: a server that
    does not answer yet counts as "not yet", not as a failure."""

    def probe() -> bool:
        try:
            return check()
        except (redis.RedisError, OSError):
            return False

    return probe


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        port = listen_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


@dataclass
class Server:
    port: int
    proc: subprocess.Popen[bytes]
    password: str | None = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, password=self.password)

    def sentinel_command(self, *args: str) -> Any:
        """``SENTINEL *args`` on this server, the reply as sent (redis-py types no ``execute_command``)."""
        execute: Callable[..., Any] = self.client().execute_command
        return execute("SENTINEL", *args)

    def cluster_ok(self) -> bool:
        info: dict[str, Any] = self.client().cluster("info")
        return info.get("cluster_state") == "ok"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def start(stack: ExitStack, port: int, workdir: Path, *args: str, password: str | None = None) -> Server:
    proc = subprocess.Popen(
        [redis_server(), *args, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = Server(port, proc, password)
    stack.callback(server.kill)
    wait_until(
        answering(lambda: services.port_open("127.0.0.1", port, 0.1)), 10, f"redis-server on port {port}"
    )
    return server


@dataclass
class Cluster:
    nodes: list[Server]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:2])


@contextmanager
def redis_cluster(masters: int = 3, ports: Sequence[int] | None = None) -> Iterator[Cluster]:
    """A cluster of ``masters`` nodes, on ``ports`` when given (a client made before the cluster exists)."""
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="reliable-cluster-") as d:
        nodes = []
        for i in range(masters):
            port = ports[i] if ports is not None else cluster_port()
            workdir = Path(d) / str(port)
            workdir.mkdir()
            nodes.append(
                start(
                    stack,
                    port,
                    workdir,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                )
            )
        cli = shutil.which("redis-cli") or services.unavailable("redis-cli binary")
        created = subprocess.run(
            [str(cli), "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes), "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert created.returncode == 0, created.stdout + created.stderr
        for n in nodes:
            wait_until(answering(n.cluster_ok), what=f"cluster_state:ok on {n.port}")
        yield Cluster(nodes)


@dataclass
class SentinelGroup:
    master: Server
    replica: Server | None
    sentinel: Server
    killed: list[Server] = field(default_factory=list)

    @property
    def url(self) -> str:
        auth = f":{self.master.password}@" if self.master.password else ""
        query = f"?sentinel_password={self.sentinel.password}" if self.sentinel.password else ""
        return f"redis+sentinel://{auth}127.0.0.1:{self.sentinel.port}/{SERVICE}/0{query}"

    def master_port(self) -> int:
        addr = self.sentinel.sentinel_command("get-master-addr-by-name", SERVICE)
        return int(addr[1])

    def fail_over(self, timeout_s: float = 60.0) -> Server:
        """Kill the master and wait until the sentinel has promoted the replica; returns the new master."""
        replica = self.replica
        assert replica is not None, "a group started without a replica cannot fail over"
        self.master.kill()
        self.killed.append(self.master)
        wait_until(
            answering(lambda: self.master_port() == replica.port),
            timeout_s,
            "the sentinel to promote the replica",
        )
        wait_until(
            answering(lambda: replica.client().info("replication")["role"] == "master"),
            timeout_s,
            "the promoted replica to accept writes",
        )
        return replica


@contextmanager
def redis_sentinel(
    *, replica: bool = True, master_password: str | None = None, sentinel_password: str | None = None
) -> Iterator[SentinelGroup]:
    """The group; ``master_password`` / ``sentinel_password``: ``requirepass`` on the master (and the
    replica) / on the sentinel, which monitors the master with ``auth-pass``."""
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="reliable-sentinel-") as d:
        common = ["--save", "", "--appendonly", "no"]
        if master_password:
            common += ["--requirepass", master_password, "--masterauth", master_password]
        mport, rport, sport = (listen_port() for _ in range(3))
        dirs = {p: Path(d) / str(p) for p in (mport, rport, sport)}
        for path in dirs.values():
            path.mkdir()
        master = start(stack, mport, dirs[mport], *common, password=master_password)
        second: Server | None = None
        if replica:
            second = start(
                stack,
                rport,
                dirs[rport],
                *common,
                "--replicaof",
                "127.0.0.1",
                str(mport),
                password=master_password,
            )
            synced = second
            wait_until(
                answering(lambda: synced.client().info("replication").get("master_link_status") == "up"),
                what="the replica to sync",
            )
        conf = dirs[sport] / "sentinel.conf"
        conf.write_text(
            f"sentinel monitor {SERVICE} 127.0.0.1 {mport} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
            + (f"sentinel auth-pass {SERVICE} {master_password}\n" if master_password else "")
            + (f"requirepass {sentinel_password}\n" if sentinel_password else "")
        )
        sentinel = start(stack, sport, dirs[sport], str(conf), "--sentinel", password=sentinel_password)
        group = SentinelGroup(master, second, sentinel)
        wait_until(
            answering(lambda: len(sentinel.sentinel_command("replicas", SERVICE)) == int(replica)),
            what="the sentinel to discover the replica",
        )
        yield group
