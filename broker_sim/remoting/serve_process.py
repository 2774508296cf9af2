"""``broker-sim serve`` as a child process, for tests and benchmarks that need a real server process (signals,
SIGKILL, restarts on the same ports, clients in other processes).

``ServeProcess(store, "--set", "topics={...}").start()`` runs ``python -m broker_sim serve`` on port 0 (or
given ports), waits for its ``broker-sim ready namesrv=… broker=…`` line and records both addresses;
``command="namesrv"`` / ``"broker"`` runs those commands instead (a broker's ``extra`` names its
``--namesrv``). ``stop(sig)`` signals it and returns its exit code, ``kill()`` ends it by pid whatever
its state. Used as a context manager it starts on entry and stops (SIGTERM, then SIGKILL if needed) on
exit. The child's stderr goes to ``stderr_path`` (appended) or a pipe (read it with :meth:`communicate`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)
READY_PREFIX = "broker-sim ready"
_ROOT = Path(__file__).resolve().parents[2]


class ServeProcess:
    def __init__(
        self,
        store: Path,
        *extra: str,
        log_level: str = "WARNING",
        stderr_path: Path | None = None,
        command: str = "serve",
    ) -> None:
        self.store = store
        self.subcommand = command
        self.extra = list(extra)
        self.log_level = log_level
        self.stderr_path = stderr_path
        self.proc: subprocess.Popen[str] | None = None
        self.started: list[subprocess.Popen[str]] = []  # every process started, for cleanup after failures
        self.namesrv = self.broker = ""

    def command(self, namesrv_port: int = 0, broker_port: int = 0) -> list[str]:
        head = [sys.executable, "-m", "broker_sim", self.subcommand, "--log-level", self.log_level]
        if self.subcommand == "namesrv":
            return [*head, "--port", str(namesrv_port), *self.extra]
        if self.subcommand == "broker":
            return [*head, "--store", str(self.store), "--port", str(broker_port), *self.extra]
        return [
            *head, "--store", str(self.store),
            "--namesrv-port", str(namesrv_port), "--broker-port", str(broker_port), *self.extra,
        ]  # fmt: skip

    def start(self, namesrv_port: int = 0, broker_port: int = 0, *, attempts: int = 1) -> ServeProcess:
        """Start and wait for the ready line. On fixed ports a restart can briefly find a port taken (a
        client's outgoing connection drew it as its ephemeral port): the server then exits with a one-line
        error, and ``attempts`` > 1 tries again."""
        path = os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        line = ""
        for _ in range(max(1, attempts)):
            stderr = self.stderr_path.open("a") if self.stderr_path else subprocess.PIPE
            try:
                self.proc = subprocess.Popen(
                    self.command(namesrv_port, broker_port),
                    stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                )  # fmt: skip
            finally:
                if self.stderr_path is not None and not isinstance(stderr, int):
                    stderr.close()
            self.started.append(self.proc)
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()  # blocks until ready, or EOF if it failed to start
            if line.startswith(READY_PREFIX):
                fields = dict(part.split("=", 1) for part in line.split()[2:] if "=" in part)
                self.namesrv, self.broker = fields["namesrv"], fields["broker"]
                return self
            self.proc.wait(timeout=30)
        detail = ""
        if self.proc is not None and self.proc.stderr is not None:
            detail = self.proc.stderr.read()
        raise RuntimeError(f"broker-sim serve did not start: {line!r} {detail}".strip())

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def ports(self) -> tuple[int, int]:
        def port(addr: str) -> int:
            return int(addr.rsplit(":", 1)[1]) if addr else 0

        return port(self.namesrv), port(self.broker)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send ``sig`` and return the exit code (negative: killed by a signal)."""
        assert self.proc is not None, "not started"
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def communicate(self) -> str:
        """The child's remaining stderr (when not redirected to a file), after it exited."""
        assert self.proc is not None, "not started"
        _, err = self.proc.communicate(timeout=30)
        return err or ""

    def kill(self) -> None:
        """End every process this object started that still runs (by its pid)."""
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()
            if proc.stderr is not None:
                proc.stderr.close()

    def __enter__(self) -> ServeProcess:
        return self.start() if self.proc is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.stop()
            except subprocess.TimeoutExpired:
                log.warning("broker-sim serve (pid %d) ignored SIGTERM for 30 s; killing it", self.pid)
        self.kill()
