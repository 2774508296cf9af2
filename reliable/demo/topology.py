"""Where the broker and the consumers run: separate processes (the real thing) or one process (fallback).

* :class:`ProcessTopology` — ``broker-sim serve`` as a child process on free loopback ports, one child process
  per consumer. SIGKILL, broker crash/restart and every other fault are real process-level events.
* :class:`InProcessTopology` — an in-process broker_sim ``Broker`` and consumer *threads*. Used when the
  network server is not available (``--mode inprocess``, or ``auto`` without it); the pipeline is the same,
  but a "killed" consumer is a consumer stopped without persisting offsets, and the broker cannot be
  crashed and restarted under live clients.

Both expose the same small interface to the runner, so the orchestration and the chaos faults are written
once.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from reliable.demo import parts
from reliable.demo.chaos import FaultUnsupported
from reliable.demo.crashloop import exit_reason
from reliable.demo.services import (
    SIG_DROP_DB,
    SIG_LOSE_COMMITS,
    BrokerServer,
    ManagedProcess,
    WorkerConfig,
    worker_process,
)
from reliable.demo.transport import SendWatch

log = logging.getLogger("reliable.demo")


def network_available() -> bool:
    """True when ``broker-sim serve`` and the TCP client transport are installed."""
    return (
        importlib.util.find_spec("broker_sim.cli") is not None
        and importlib.util.find_spec("broker_sim.remoting.client_transport") is not None
    )


class ConsumerSlot(Protocol):
    name: str
    #: ``time.monotonic()`` when the consumer was started (a death soon after is a start-up failure)
    started_at: float

    def alive(self) -> bool: ...

    def exit_reason(self) -> str:
        """How a consumer that is no longer alive ended (exit code or signal, and its last log line)."""
        ...


class Topology(Protocol):
    mode: str

    @property
    def address(self) -> Any:
        """What a broker_sim client takes to reach the broker (a Broker, or the name server address)."""
        ...

    def start_broker(self, topic: str, queues: int) -> None: ...
    def stop_broker(self) -> None: ...
    def crash_broker(self, down_ms: int) -> str: ...
    def lose_master(self, down_ms: int, sends: SendWatch) -> str: ...
    def lose_slave(self, down_ms: int, sends: SendWatch) -> str: ...
    def start_consumer(self, config: WorkerConfig) -> ConsumerSlot: ...
    def stop_consumer(self, slot: ConsumerSlot) -> None: ...
    def kill_consumer(self, slot: ConsumerSlot) -> None: ...
    def drop_db_connections(self, slot: ConsumerSlot) -> None: ...
    def lose_offset_commits(self, slot: ConsumerSlot) -> None: ...
    def lag(self, topic: str, group: str) -> int | None: ...


@dataclass
class ProcessSlot:
    name: str
    process: ManagedProcess
    started_at: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        return self.process.alive()

    def exit_reason(self) -> str:
        proc = self.process.proc
        return exit_reason(None if proc is None else proc.returncode, self.process.log_path)


@dataclass
class ProcessConsumers:
    """Consumer worker processes (``python -m reliable.demo.worker``), whatever runs the broker."""

    log_dir: Path

    def start_consumer(self, config: WorkerConfig) -> ConsumerSlot:
        proc = worker_process(config, self.log_dir)
        proc.start()
        return ProcessSlot(config.name, proc)

    def _proc(self, slot: ConsumerSlot) -> ManagedProcess:
        assert isinstance(slot, ProcessSlot)
        return slot.process

    def stop_consumer(self, slot: ConsumerSlot) -> None:
        self._proc(slot).stop()

    def kill_consumer(self, slot: ConsumerSlot) -> None:
        self._proc(slot).kill()

    def drop_db_connections(self, slot: ConsumerSlot) -> None:
        self._proc(slot).signal(SIG_DROP_DB)

    def lose_offset_commits(self, slot: ConsumerSlot) -> None:
        self._proc(slot).signal(SIG_LOSE_COMMITS)


class ConsumerProcessesOf:
    """The consumer half of a topology whose consumers are processes: delegates to ``self.workers``."""

    workers: ProcessConsumers

    def start_consumer(self, config: WorkerConfig) -> ConsumerSlot:
        return self.workers.start_consumer(config)

    def stop_consumer(self, slot: ConsumerSlot) -> None:
        self.workers.stop_consumer(slot)

    def kill_consumer(self, slot: ConsumerSlot) -> None:
        self.workers.kill_consumer(slot)

    def drop_db_connections(self, slot: ConsumerSlot) -> None:
        self.workers.drop_db_connections(slot)

    def lose_offset_commits(self, slot: ConsumerSlot) -> None:
        self.workers.lose_offset_commits(slot)


@dataclass
class ProcessTopology(ConsumerProcessesOf):
    """broker-sim serve + consumer processes."""

    store_dir: Path
    log_dir: Path
    mode: str = "process"
    server: BrokerServer | None = None
    _admin: Any = None

    def __post_init__(self) -> None:
        self.workers = ProcessConsumers(self.log_dir)

    @property
    def address(self) -> Any:
        assert self.server is not None
        return self.server.address

    def start_broker(self, topic: str, queues: int) -> None:
        self.server = BrokerServer(self.store_dir, self.log_dir, parts.serve_args({topic: queues}))
        self.server.start()
        self._admin = parts.admin(self.address)
        self._admin.track(topic, queues)

    def stop_broker(self) -> None:
        if self._admin is not None:
            parts.close_quietly(self._admin)
            self._admin = None
        if self.server is not None:
            self.server.stop()

    def crash_broker(self, down_ms: int) -> str:
        assert self.server is not None
        self.server.crash()
        parts.pause(down_ms / 1000)
        self.server.restart()
        return f"broker power cut (unflushed data discarded, process killed), restarted after {down_ms} ms"

    def lose_master(self, down_ms: int, sends: SendWatch) -> str:
        raise FaultUnsupported("one broker, no slave: run with --brokers N --slaves M")

    def lose_slave(self, down_ms: int, sends: SendWatch) -> str:
        raise FaultUnsupported("one broker, no slave: run with --brokers N --slaves M")

    def lag(self, topic: str, group: str) -> int | None:
        return None if self._admin is None else parts.lag(self._admin, topic, group)


@dataclass
class ThreadSlot:
    name: str
    worker: Any
    running: bool = True
    started_at: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        return self.running

    def exit_reason(self) -> str:
        return "its consumer thread stopped"


@dataclass
class InProcessTopology:
    """An in-process Broker and consumer threads (fallback when the network server is unavailable)."""

    store_dir: Path
    mode: str = "inprocess"
    broker: Any = None
    _admin: Any = None

    @property
    def address(self) -> Any:
        return self.broker

    def start_broker(self, topic: str, queues: int) -> None:
        self.broker = parts.in_process_broker(self.store_dir, parts.broker_config({topic: queues}))
        self._admin = parts.admin(self.broker)
        self._admin.track(topic, queues)

    def stop_broker(self) -> None:
        if self.broker is not None:
            self.broker.shutdown()

    def crash_broker(self, down_ms: int) -> str:
        raise FaultUnsupported("an in-process broker cannot be crashed under live in-process clients")

    def lose_master(self, down_ms: int, sends: SendWatch) -> str:
        raise FaultUnsupported("an in-process broker has no slave")

    def lose_slave(self, down_ms: int, sends: SendWatch) -> str:
        raise FaultUnsupported("an in-process broker has no slave")

    def start_consumer(self, config: WorkerConfig) -> ConsumerSlot:
        from reliable.demo.worker import Worker

        worker = Worker(config, broker=self.broker)
        worker.start()
        return ThreadSlot(config.name, worker)

    def _worker(self, slot: ConsumerSlot) -> Any:
        assert isinstance(slot, ThreadSlot)
        return slot.worker

    def stop_consumer(self, slot: ConsumerSlot) -> None:
        self._worker(slot).stop()
        assert isinstance(slot, ThreadSlot)
        slot.running = False

    def kill_consumer(self, slot: ConsumerSlot) -> None:
        self._worker(slot).kill()
        assert isinstance(slot, ThreadSlot)
        slot.running = False

    def drop_db_connections(self, slot: ConsumerSlot) -> None:
        self._worker(slot).drop_db_connections()

    def lose_offset_commits(self, slot: ConsumerSlot) -> None:
        self._worker(slot).lose_offset_commits()

    def lag(self, topic: str, group: str) -> int | None:
        return None if self._admin is None else parts.lag(self._admin, topic, group)
