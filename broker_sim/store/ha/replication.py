"""What replication adds to a store's put path, by role (``CommitLog.handleHA`` and the slave check in
``DefaultMessageStore.putMessage``): a slave refuses puts; a master wakes its HA writers after each append;
a ``SYNC_MASTER`` waits for a slave's acknowledgement (up to ``syncFlushTimeout``) and otherwise reports
``FLUSH_SLAVE_TIMEOUT`` or ``SLAVE_NOT_AVAILABLE`` — the message is stored either way."""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker_sim.store.commit_log import CommitLog
from broker_sim.store.config import BrokerRole, StoreConfig
from broker_sim.store.ha.master import HAService, ReplicaResult
from broker_sim.store.ha.slave import HAClient

log = logging.getLogger("broker_sim.store.ha")


class Replication:
    def __init__(
        self, config: StoreConfig, commit_log: CommitLog, on_replica_data: Callable[[], None]
    ) -> None:
        self.role = config.broker_role
        self.sync_timeout_s = config.sync_flush_timeout_ms / 1000
        #: a slave's master HA address; the broker updates it from its name-server registration
        self.master_ha_address = config.ha_master_address
        self.service: HAService | None = None
        self.client: HAClient | None = None
        if self.role is BrokerRole.SLAVE:
            self.client = HAClient(commit_log, lambda: self.master_ha_address, on_replica_data)
        elif config.ha_listen_port is not None or self.role is BrokerRole.SYNC_MASTER:
            # a SYNC_MASTER always has the service: without a slave its sends report SLAVE_NOT_AVAILABLE
            self.service = HAService(
                commit_log,
                config.ha_listen_host or config.store_host[0],
                config.ha_listen_port or 0,
                announce_host=config.store_host[0],
                fallbehind_max=config.ha_slave_fallbehind_max,
            )

    @property
    def is_slave(self) -> bool:
        return self.role is BrokerRole.SLAVE

    @property
    def ha_address(self) -> str:
        """The master's HA address to register with the name server ("" without one)."""
        return self.service.address if self.service is not None else ""

    def start(self) -> None:
        if self.service is not None:
            self.service.start()
        if self.client is not None:
            self.client.start()

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
        if self.client is not None:
            self.client.stop()

    @property
    def waits(self) -> bool:
        """True when a put must go through :meth:`after_append` (a SYNC_MASTER with an HA service)."""
        return self.service is not None and self.role is BrokerRole.SYNC_MASTER

    def appended(self) -> None:
        if self.service is not None:
            self.service.notify_appended()

    def wait(self, end_offset: int) -> ReplicaResult:
        """SYNC_MASTER: block until a slave has ``end_offset``; OK at once for an ASYNC_MASTER."""
        self.appended()
        if not self.waits:
            return ReplicaResult.OK
        assert self.service is not None
        return self.service.wait_replicated(end_offset, self.sync_timeout_s)
