"""Fixtures of the RocketMQ 5.x tests: the 5.x venv, an in-process broker with the gRPC front end on a manual
clock, and drivers of the official 5.x client running in the 5.x venv (see venv5.py for why two venvs)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker_sim.clock import ManualClock
from broker_sim.grpc.policy import GroupPolicy
from broker_sim.grpc.protocol import PROTOCOL_ENV
from broker_sim.remoting.serve import BrokerSimServer, ServeConfig
from tests.adapters.rocketmq5 import venv5

HERE = Path(__file__).resolve().parent
TOPIC = "Orders5"
REPLY_TIMEOUT_S = 60.0


@pytest.fixture(scope="session")
def rmq5_python() -> Iterator[Path]:
    """The 5.x venv's python; also points broker_sim's protocol loader at its site-packages."""
    python = venv5.ensure_venv()
    previous = os.environ.get(PROTOCOL_ENV)
    os.environ[PROTOCOL_ENV] = str(venv5.site_packages())
    yield python
    if previous is None:
        os.environ.pop(PROTOCOL_ENV, None)
    else:
        os.environ[PROTOCOL_ENV] = previous


class Client5:
    """The official 5.x client in a subprocess of the 5.x venv, one JSON command at a time."""

    def __init__(self, python: Path, endpoint: str, log_dir: Path) -> None:
        env = {**os.environ, "HOME": str(log_dir)}  # the 5.x client writes its log under ~/logs
        self.proc = subprocess.Popen(
            [str(python), str(HERE / "driver.py"), endpoint],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        self._replies: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._replies.put(line)

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        try:
            reply: dict[str, Any] = json.loads(self._replies.get(timeout=REPLY_TIMEOUT_S))
        except queue.Empty:
            raise AssertionError(f"the 5.x driver did not answer {op}") from None
        if not reply.pop("ok"):
            raise RuntimeError(reply["error"] + "\n" + reply.get("trace", ""))
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("shutdown")
                self.proc.wait(20)
            except (AssertionError, RuntimeError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


@dataclass
class GrpcBroker:
    server: BrokerSimServer
    clock: ManualClock
    python: Path
    log_dir: Path
    clients: list[Client5] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        assert self.server.grpc is not None
        return self.server.grpc.address

    def client(self) -> Client5:
        c = Client5(self.python, self.endpoint, self.log_dir)
        self.clients.append(c)
        return c

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)


GrpcBrokerFactory = Callable[..., GrpcBroker]


@pytest.fixture
def make_broker(rmq5_python: Path, tmp_path: Path) -> Iterator[GrpcBrokerFactory]:
    made: list[GrpcBroker] = []

    def make(
        groups: dict[str, GroupPolicy] | None = None, topics: dict[str, int] | None = None,
        clock_start_ms: int | None = None, ports: tuple[int, int, int] = (0, 0, 0),
    ) -> GrpcBroker:  # fmt: skip
        """``clock_start_ms``: where the manual clock starts (a sender that stamps wall-clock times needs
        the broker's clock near the wall clock); default ManualClock's own start. ``ports``: name server,
        4.x broker and gRPC ports (0: any free one; fixed ones for a broker a test restarts)."""
        clock = ManualClock() if clock_start_ms is None else ManualClock(clock_start_ms)
        namesrv_port, broker_port, grpc_port = ports
        config = ServeConfig(
            store_dir=tmp_path / f"store{len(made)}", namesrv_port=namesrv_port, broker_port=broker_port,
            grpc_port=grpc_port,
            broker_config={"topics": topics or {TOPIC: 4}, "clock": clock}, grpc_groups=groups or {},
        )  # fmt: skip
        server = BrokerSimServer(config)
        server.start()
        broker = GrpcBroker(server, clock, rmq5_python, tmp_path)
        made.append(broker)
        return broker

    yield make
    for b in made:
        for c in b.clients:
            c.close()
        b.server.shutdown()
