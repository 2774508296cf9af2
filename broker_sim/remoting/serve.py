"""``broker-sim serve``: a name server and one broker over the same store, in one process; also the body
of ``broker-sim namesrv`` (name server only) and ``broker-sim broker`` (broker only, registering with name
servers that run elsewhere).

The broker finds its way into routes the way a RocketMQ broker does: it registers (REGISTER_BROKER) with
every name server it is given — its own, when this process runs one, plus ``namesrv_addrs`` — before the
ready line, every 30 s after, and at once when a topic is created or changed
(:mod:`broker_sim.remoting.registration`).

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

from broker_sim.common.net import announce_host
from broker_sim.namesrv.processor import NameServerProcessor
from broker_sim.remoting.acl import AclGuard
from broker_sim.remoting.admin_handlers import AdminHandlers
from broker_sim.remoting.broker_server import BrokerHandlers
from broker_sim.remoting.ops_handlers import OpsHandlers
from broker_sim.remoting.registration import BrokerIdentity, NameServerRegistrar
from broker_sim.remoting.server import Connection, RemotingServer
from broker_sim.remoting.slave_sync import SlaveSynchronize, SyncHandlers

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
    #: run a name server in this process (``namesrv_port``); False for ``broker-sim broker``
    run_namesrv: bool = True
    #: run a broker in this process; False for ``broker-sim namesrv``
    run_broker: bool = True
    #: other name servers the broker registers with (besides this process's own)
    namesrv_addrs: list[str] = field(default_factory=list)
    #: also serve RocketMQ 5.x gRPC (``apache.rocketmq.v2.MessagingService``) on this port (0: any free port)
    grpc_port: int | None = None
    #: 5.x consumer group policies (retry, FIFO) by group name: ``broker_sim.grpc.policy.GroupPolicy``
    grpc_groups: dict[str, Any] = field(default_factory=dict)
    #: the host registered with the name servers and told to clients (brokerIP1); None: ``host``, or this
    #: machine's own address when ``host`` is a wildcard such as 0.0.0.0 (``broker_sim.common.net``)
    announce_host: str | None = None


class BrokerSimServer:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.announced_host = announce_host(config.host, config.announce_host)
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
        self.namesrv = NameServerProcessor()
        self.namesrv_server = RemotingServer(
            self.namesrv.handlers(),
            config.host,
            config.namesrv_port,
            name="namesrv",
            workers=8,
            on_disconnect=self.namesrv.connection_closed,
        )
        self.namesrv_server.inline_codes = frozenset(self.namesrv_server.handlers)
        self.broker: Broker | None = None
        self.handlers: BrokerHandlers | None = None
        self.registrar: NameServerRegistrar | None = None
        self.slave_sync: SlaveSynchronize | None = None
        self.grpc: GrpcFrontEnd | None = None
        self._stopped = threading.Event()
        #: set by SIGTERM/SIGINT once :meth:`install_stop_signals` ran; :meth:`serve_forever` waits on it
        self._stop_requested = threading.Event()
        # taken now, not in serve_forever: the parent may die right after the ready line, before that runs
        self._parent_pid = os.getppid()
        self._shutdown_lock = threading.Lock()

    @property
    def namesrv_address(self) -> str:
        """This process's name server, or (``broker-sim broker``) the first one the broker registers with."""
        if self.config.run_namesrv:
            return f"{self.announced_host}:{self.namesrv_server.port}"
        return self.config.namesrv_addrs[0] if self.config.namesrv_addrs else ""

    @property
    def broker_address(self) -> str:
        return f"{self.announced_host}:{self.broker_server.port}" if self.config.run_broker else ""

    def start(self) -> None:
        """Bind, build the Broker, start serving, register with the name servers. With ``fault_signals`` the
        power-cut handler is installed first (so this must then run on the main thread): a harness may send
        SIGUSR1 as soon as the ports answer, before :meth:`serve_forever` runs."""
        if self.config.fault_signals:
            signal.signal(POWER_CUT_SIGNAL, self._on_power_cut)
        if self.config.run_namesrv:
            self.namesrv_server.bind()
        if self.config.run_broker:
            self._start_broker()
        if self.config.run_namesrv:  # accepts clients only once the broker here has registered
            self.namesrv_server.start()
            self.namesrv.start_scan()
        log.info(
            "broker-sim serving: namesrv %s, broker %s, store %s",
            self.namesrv_address,
            self.broker_address,
            self.config.store_dir,
        )

    def _start_broker(self) -> None:
        from broker_sim.broker.broker import Broker
        from broker_sim.store.config import FlushDiskType

        self.broker_server.bind()
        address = self.broker_address
        options = {
            "broker_name": self.config.broker_name,
            "cluster_name": self.config.cluster,
            "broker_addr": address,
            "ha_listen_host": self.config.host,
            **self.config.broker_config,
        }
        broker = self.broker = Broker(self.config.store_dir, **options)
        broker.start()
        self.handlers = BrokerHandlers(broker, address)
        self.broker_server.handlers = {
            **self.handlers.handlers(),
            **AdminHandlers(broker, address).handlers(),
            **OpsHandlers(broker).handlers(),
            **SyncHandlers(broker).handlers(),
        }
        sync_flush = broker.store.config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        self.broker_server.inline_codes = frozenset(self.handlers.non_blocking_codes(sync_flush))
        if self.config.grpc_port is not None:
            from broker_sim.grpc.server import GrpcFrontEnd

            self.grpc = GrpcFrontEnd(
                broker,
                self.config.host,
                self.config.grpc_port,
                groups=self.config.grpc_groups,
                namesrv_addrs=self.config.namesrv_addrs or [a for a in [self.namesrv_address] if a],
                announce_host=self.announced_host,
            ).start()
        self.broker_server.start()
        replication = broker.store.replication
        identity = BrokerIdentity(
            self.config.cluster,
            self.config.broker_name,
            broker.config.broker_id,
            address,
            replication.ha_address,
        )
        registrar = self.registrar = NameServerRegistrar(
            identity,
            self.config.namesrv_addrs,
            lambda: {tc.topic_name: tc.to_json() for tc in broker.topics.topics()},
            local=self.namesrv if self.config.run_namesrv else None,
        )
        if replication.is_slave:
            configured = bool(replication.master_ha_address)
            self.slave_sync = SlaveSynchronize(broker, lambda: registrar.master_addr)

            def learn_master(master: str, ha: str) -> None:
                # BrokerController.registerBrokerAll: a slave follows the master the name server names
                if not configured and ha:
                    replication.master_ha_address = ha

            registrar.on_master = learn_master
        registrar.start()
        broker.topics.on_change = registrar.register_all
        if self.slave_sync is not None:
            self.slave_sync.sync_all()
            self.slave_sync.start()

    def _on_disconnect(self, conn: Connection) -> None:
        if self.handlers is not None and self.broker is not None and self.broker.running:
            self.handlers.connection_closed(conn)

    def shutdown(self) -> None:
        with self._shutdown_lock:
            if self._stopped.is_set():
                return
            log.info("broker-sim shutting down")
            if self.slave_sync is not None:
                self.slave_sync.stop()
            if self.registrar is not None:
                if self.broker is not None:
                    self.broker.topics.on_change = None
                self.registrar.shutdown()
            self.namesrv.stop()
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
