"""``broker-sim serve``: a name server and one broker over the same store, in one process.

Start-up order matters: the broker's listening socket is bound first (so ``--broker-port 0`` resolves to a
real port), then the Broker is built with that address as its store host — message ids and the STOREHOST
of every record name an address clients can reach (G7) — then both servers start accepting.

Shutdown (SIGTERM, SIGINT or :meth:`BrokerSimServer.shutdown`) is the reverse: stop accepting and close
client connections, then shut the Broker down, which persists offsets and config and removes the abort
file, so the next start is a clean one.
"""

from __future__ import annotations

import logging
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

log = logging.getLogger("broker_sim.remoting.serve")


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
        self._stopped = threading.Event()
        self._shutdown_lock = threading.Lock()

    @property
    def namesrv_address(self) -> str:
        return self.namesrv_server.address

    @property
    def broker_address(self) -> str:
        return self.broker_server.address

    def start(self) -> None:
        from broker_sim.broker.broker import Broker

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
            if self.broker is not None:
                self.broker.shutdown()
            self._stopped.set()
            log.info("broker-sim stopped")

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def serve_forever(self) -> None:
        """Run until SIGTERM/SIGINT (must be called from the main thread)."""
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("received signal %d", signum)
            stop.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            stop.wait()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            self.shutdown()
