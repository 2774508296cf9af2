"""The demo on a broker_sim *cluster*: a name server and N broker groups of a master and M slaves, every one
its own process (``--brokers N --slaves M [--replication sync|async]``).

The producer, the consumer workers, the sweeper and the admin all reach the cluster through the name
server address only — the same adapters and clients as against one broker. The cluster is broker_sim's own
launcher (:class:`broker_sim.remoting.cluster_process.ClusterProcess`): ports chosen up front, so a broker
that lost power restarts where the name server and its slaves expect it.

Faults on a cluster (``--chaos``):

* **master loss** — a group's master loses power (SIGUSR1: what it had not flushed is gone, as after a
  real power cut), stays down for a few seconds and restarts on its store. Meanwhile the producers send to
  the other groups (their latency fault tolerance keeps them off the dead group), and consumers read the
  dead group's queues from its slave. Under ``ASYNC_MASTER`` the slave is frozen just before the cut (a
  slave that lags, as over a slow network) while its master acknowledges a few more sends: what neither
  the slave received nor the master flushed is lost, and the sweeper finds those messages unconfirmed and
  sends them again. (Over loopback an unfrozen slave is never behind, and the window would be empty.)
* **slave loss** — a slave is killed and restarted. Under ``SYNC_MASTER`` its master's sends answer
  ``SLAVE_NOT_AVAILABLE`` (11) / ``FLUSH_SLAVE_TIMEOUT`` (12) until it is back: the message is stored on
  the master, the producer reports the status and the stub stays what it is (sent), so nothing is lost.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reliable.demo import parts
from reliable.demo.chaos import FaultUnsupported
from reliable.demo.errors import DemoError, ServiceStartError
from reliable.demo.topology import ConsumerProcessesOf, ProcessConsumers
from reliable.demo.transport import SendWatch

log = logging.getLogger("reliable.demo")

#: an ASYNC_MASTER's slave lags until its master acknowledged this many sends it has not got …
LAG_ACKS = 5
#: … or for at most this long (production may be paused, waiting for the consumers)
LAG_MAX_S = 3.0


@dataclass(frozen=True)
class ClusterShape:
    """``--brokers N --slaves M --replication sync|async``."""

    brokers: int = 2
    slaves: int = 1
    replication: str = "async"

    def validate(self) -> None:
        if self.brokers < 1:
            raise DemoError("--brokers must be > 0")
        if self.slaves < 0:
            raise DemoError("--slaves must be >= 0")
        if self.replication not in ("sync", "async"):
            raise DemoError(f"--replication must be sync or async, not {self.replication!r}")
        if self.replication == "sync" and self.slaves == 0:
            raise DemoError("--replication sync needs a slave: add --slaves 1")

    @property
    def names(self) -> list[str]:
        """The broker groups' names, as the launcher gives them (broker-a, broker-b, …)."""
        return [f"broker-{chr(ord('a') + g)}" for g in range(self.brokers)]

    def describe(self) -> str:
        role = "SYNC_MASTER" if self.replication == "sync" else "ASYNC_MASTER"
        return f"{self.brokers} broker groups × (master + {self.slaves} slave(s)), {role}, ASYNC_FLUSH"


def cluster_args(topics: dict[str, int]) -> tuple[str, ...]:
    """The demo broker's options (:func:`parts.broker_config`) as ``--set`` flags of every broker."""
    out = []
    for key, value in parts.broker_config(topics).items():
        out.append(f"--set={key}={json.dumps(value) if isinstance(value, dict) else value}")
    return tuple(out)


@dataclass
class ClusterTopology(ConsumerProcessesOf):
    """A broker_sim cluster of processes + consumer processes, reached through the name server."""

    store_dir: Path
    log_dir: Path
    shape: ClusterShape
    mode: str = "cluster"
    cluster: Any = None
    _admin: Any = None
    _victims: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.workers = ProcessConsumers(self.log_dir)

    @property
    def address(self) -> Any:
        assert self.cluster is not None
        return self.cluster.namesrv

    def start_broker(self, topic: str, queues: int) -> None:
        from broker_sim.remoting.cluster_process import ClusterProcess

        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.cluster = ClusterProcess(
            self.store_dir,
            brokers=self.shape.brokers,
            slaves=self.shape.slaves,
            replication=self.shape.replication,
            flush="ASYNC_FLUSH",
            extra=cluster_args({topic: queues}),
            log_level="INFO",
            stderr_path=self.log_dir / "cluster.log",
        )
        try:
            self.cluster.start()
        except Exception as exc:
            self.cluster.stop()
            raise ServiceStartError(f"broker_sim cluster did not start: {exc}") from exc
        self._admin = parts.admin(self.address)
        self._admin.track(topic, queues, self.shape.names)

    def stop_broker(self) -> None:
        if self._admin is not None:
            parts.close_quietly(self._admin)
            self._admin = None
        if self.cluster is not None:
            self.cluster.stop()

    def _next(self, role: str) -> str:
        """The group whose node loses power next: the groups in turn, so two faults hit two groups."""
        with self._lock:
            n = self._victims.get(role, 0)
            self._victims[role] = n + 1
        return self.shape.names[n % self.shape.brokers]

    def lose_master(self, down_ms: int, sends: SendWatch) -> str:
        if self.shape.brokers < 2:
            raise FaultUnsupported("one broker group: nowhere to send while its master is down")
        name = self._next("master")
        lagged = ""
        if self.shape.replication == "async" and self.shape.slaves:
            lagged = self._slave_lags(name, sends)
        self.cluster.power_cut(name, 0)
        outage = SendWatch(sends.transport)  # what the producer sees from the cut on
        if lagged:
            os.kill(self.cluster.node(name, 1).process.pid, signal.SIGCONT)
        return self._back_after(name, 0, down_ms, outage, f"{name} master power cut{lagged}")

    def lose_slave(self, down_ms: int, sends: SendWatch) -> str:
        if self.shape.slaves < 1:
            raise FaultUnsupported("no slaves (--slaves 0)")
        name = self._next("slave")
        self.cluster.power_cut(name, 1)
        return self._back_after(name, 1, down_ms, sends, f"{name} slave power cut")

    def _slave_lags(self, name: str, sends: SendWatch) -> str:
        """Freeze the slave of ``name`` (SIGSTOP: a slave that lags, as over a slow network) until its
        ASYNC_MASTER acknowledged a few sends it cannot have (or :data:`LAG_MAX_S` passed): what the master
        had not flushed either is then lost by the power cut that follows — the unreplicated window."""
        os.kill(self.cluster.node(name, 1).process.pid, signal.SIGSTOP)
        watch = SendWatch(sends.transport)
        deadline = time.monotonic() + LAG_MAX_S
        while watch.acked(name) < LAG_ACKS and time.monotonic() < deadline:
            parts.pause(0.02)
        return f" after its slave lagged through {watch.acked(name)} acknowledged sends"

    def _back_after(self, name: str, broker_id: int, down_ms: int, sends: SendWatch, what: str) -> str:
        """Let ``down_ms`` pass with node ``broker_id`` of ``name`` down, say what the producer saw
        meanwhile, restart the node on its store (the same ports, so clients and slaves find it)."""
        parts.pause(down_ms / 1000)
        seen = sends.describe()
        self.cluster.restart(name, broker_id)
        return f"{what} (unflushed data lost), down {down_ms} ms, restarted; {seen}"

    def crash_broker(self, down_ms: int) -> str:
        raise FaultUnsupported("on a cluster a group's master is what dies: see master_loss")

    def lag(self, topic: str, group: str) -> int | None:
        return None if self._admin is None else parts.lag(self._admin, topic, group)
