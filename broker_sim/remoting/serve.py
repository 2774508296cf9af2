"""``broker-sim serve``: a name server and one broker over the same store, in one process.

Start-up order matters: the broker's listening socket is bound first (so ``--broker-port 0`` resolves to a
real port), then the Broker is built with that address as its store host — message ids and the STOREHOST
of every record name an address clients can reach (G7) — then both servers start accepting.

Shutdown (SIGTERM, SIGINT or :meth:`BrokerSimServer.shutdown`) is the reverse: stop accepting and close
client connections, then shut the Broker down, which persists offsets and config and removes the abort
file, so the next start is a clean one.

Two opt-in behaviours serve test harnesses (both off by default, see ``broker-sim serve --help``):

* ``fault_signals`` (``--fault-signals``): SIGUSR1 is a *power cut*. A ``kill -9`` of this process loses
  nothing that was written, because the commit log is memory-mapped and the page cache outlives the
  process (as with RocketMQ; only a machine crash loses what ASYNC_FLUSH had not flushed). To let a
  chaos harness cause the crash that *does* lose data, SIGUSR1 runs the broker's own fault injector
  (``broker.faults.crash_broker``, the same path as the in-process crash fault): every commit-log and
  consume-queue byte not yet flushed is discarded, nothing is persisted, the abort file stays, and the
  process exits at once with status :data:`POWER_CUT_EXIT`. The next start then runs crash recovery.
* ``exit_with_parent`` (``--exit-with-parent``): stop cleanly, as on SIGTERM, when the process that
  started this one exits, so a harness that is itself SIGKILLed leaves no broker behind.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from broker_sim.remoting.acl import AclGuard
from broker_sim.remoting.admin_handlers import AdminHandlers
from broker_sim.remoting.broker_server import BrokerHandlers
from broker_sim.remoting.name_server import BrokerTopics, NameServer
from broker_sim.remoting.server import Connection, RemotingServer

if TYPE_CHECKING:
    from broker_sim.broker.broker import Broker
    from broker_sim.grpc.server import GrpcFrontEnd

log = logging.getLogger("broker_sim.remoting.serve")

#: the signal that simulates a power cut when ``fault_signals`` is on
POWER_CUT_SIGNAL = signal.SIGUSR1
#: exit status after a simulated power cut (128 + SIGKILL, as a killed process would report)
POWER_CUT_EXIT = 137


@dataclass
class ServeConfig:
    store_dir: Path
    host: str = "127.0.0.1"
    namesrv_port: int = 9876
    broker_port: int = 10911
    broker_name: str = "broker-a"
    cluster: str = "DefaultCluster"
    acl_accounts: dict[str, str] = field(default_factory=dict)
    broker_config: dict[str, Any] = field(default_factory=dict)
    workers: int = 64
    #: SIGUSR1 = power cut (drop unflushed data, keep the abort file, exit POWER_CUT_EXIT); for harnesses
    fault_signals: bool = False
    #: stop cleanly when the parent process exits
    exit_with_parent: bool = False
    #: also serve RocketMQ 5.x gRPC (``apache.rocketmq.v2.MessagingService``) on this port (0: any free port)
    grpc_port: int | None = None
    #: 5.x consumer group policies (retry, FIFO) by group name: ``broker_sim.grpc.policy.GroupPolicy``
    grpc_groups: dict[str, Any] = field(default_factory=dict)


class BrokerSimServer:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        guard = AclGuard(config.acl_accounts) if config.acl_accounts else None
        self.broker_server = RemotingServer(
            {},
            config.host,
            config.broker_port,
            name="broker",
            workers=config.workers,
            guard=guard,
            on_disconnect=self._on_disconnect,
        )
        self.namesrv_server = RemotingServer({}, config.host, config.namesrv_port, name="namesrv", workers=8)
        self.broker: Broker | None = None
        self.handlers: BrokerHandlers | None = None
        self.grpc: GrpcFrontEnd | None = None
        self._stopped = threading.Event()
        #: set by SIGTERM/SIGINT once :meth:`install_stop_signals` ran; :meth:`serve_forever` waits on it
        self._stop_requested = threading.Event()
        # taken now, not in serve_forever: the parent may die right after the ready line, before that runs
        self._parent_pid = os.getppid()
        self._shutdown_lock = threading.Lock()

    @property
    def namesrv_address(self) -> str:
        return self.namesrv_server.address

    @property
    def broker_address(self) -> str:
        return self.broker_server.address

    def start(self) -> None:
        """Bind, build the Broker, start serving. With ``fault_signals`` the power-cut handler is installed
        first (so this must then run on the main thread): a harness may send SIGUSR1 as soon as the ports
        answer, before :meth:`serve_forever` runs."""
        from broker_sim.broker.broker import Broker

        if self.config.fault_signals:
            signal.signal(POWER_CUT_SIGNAL, self._on_power_cut)
        self.broker_server.bind()
        self.namesrv_server.bind()
        address = self.broker_server.address
        options = {
            "broker_name": self.config.broker_name,
            "cluster_name": self.config.cluster,
            "broker_addr": address,
            **self.config.broker_config,
        }
        self.broker = Broker(self.config.store_dir, **options)
        self.broker.start()
        self.handlers = BrokerHandlers(self.broker, address)
        self.broker_server.handlers = {
            **self.handlers.handlers(),
            **AdminHandlers(self.broker, address).handlers(),
        }
        ns = NameServer(
            BrokerTopics(self.broker),
            address,
            broker_name=self.config.broker_name,
            cluster=self.config.cluster,
            auto_create_topics=bool(options.get("auto_create_topic_enable", False)),
        )
        self.namesrv_server.handlers = ns.handlers()
        from broker_sim.store.config import FlushDiskType

        sync_flush = self.broker.store.config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        self.broker_server.inline_codes = frozenset(self.handlers.non_blocking_codes(sync_flush))
        self.namesrv_server.inline_codes = frozenset(self.namesrv_server.handlers)
        if self.config.grpc_port is not None:
            from broker_sim.grpc.server import GrpcFrontEnd

            self.grpc = GrpcFrontEnd(
                self.broker, self.config.host, self.config.grpc_port, groups=self.config.grpc_groups
            ).start()
        self.broker_server.start()
        self.namesrv_server.start()
        log.info(
            "broker-sim serving: namesrv %s, broker %s, store %s",
            self.namesrv_address,
            address,
            self.config.store_dir,
        )

    def _on_disconnect(self, conn: Connection) -> None:
        if self.handlers is not None and self.broker is not None and self.broker.running:
            self.handlers.connection_closed(conn)

    def shutdown(self) -> None:
        with self._shutdown_lock:
            if self._stopped.is_set():
                return
            log.info("broker-sim shutting down")
            self.namesrv_server.shutdown()
            self.broker_server.shutdown()
            if self.grpc is not None:
                self.grpc.stop()
            if self.broker is not None:
                self.broker.shutdown()
            self._stopped.set()
            log.info("broker-sim stopped")

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def power_cut(self) -> None:
        """Simulate a machine losing power: unflushed data is lost, the abort file stays, exit now.

        Goes through the broker's fault injector, so the crash is counted like the in-process fault.
        ``os._exit`` skips every shutdown path on purpose: nothing may be persisted after the crash.
        """
        log.warning("power cut (signal %d): dropping unflushed data and exiting", POWER_CUT_SIGNAL)
        broker = self.broker
        if broker is not None:
            broker.faults.crash_broker(broker)
        os._exit(POWER_CUT_EXIT)

    def _on_power_cut(self, signum: int, frame: FrameType | None) -> None:
        self.power_cut()

    def _watch_parent(self, stop: threading.Event, interval_s: float = 0.5) -> None:
        parent = self._parent_pid

        def watch() -> None:
            while True:
                if os.getppid() != parent:
                    log.warning("parent process %d is gone; stopping", parent)
                    stop.set()
                    return
                if stop.wait(interval_s):
                    return

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()

    def install_stop_signals(self) -> dict[int, Any]:
        """Make SIGTERM/SIGINT request a clean stop; returns the previous handlers.

        The command line calls this *before* :meth:`start`, so a SIGTERM that arrives between the ports
        opening and :meth:`serve_forever` still ends in a clean shutdown (main thread only).
        """

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("received signal %d", signum)
            self._stop_requested.set()

        return {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}

    def serve_forever(self) -> None:
        """Run until SIGTERM/SIGINT (must be called from the main thread).

        With ``fault_signals`` SIGUSR1 triggers :meth:`power_cut` (installed by :meth:`start`); with
        ``exit_with_parent`` the server also stops when its parent process exits.
        """
        stop = self._stop_requested
        previous = self.install_stop_signals()
        if self.config.exit_with_parent:
            self._watch_parent(stop)
        try:
            stop.wait()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            self.shutdown()
