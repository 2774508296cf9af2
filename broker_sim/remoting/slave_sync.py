"""A slave's copy of its master's metadata (RocketMQ 4.9.8 ``SlaveSynchronize``): every 10 s the slave asks
the master for its topic configs (GET_ALL_TOPIC_CONFIG 21), consumer offsets (GET_ALL_CONSUMER_OFFSET 43),
delay-level offsets (GET_ALL_DELAY_OFFSET 45) and subscription groups (GET_ALL_SUBSCRIPTIONGROUP_CONFIG 201),
and takes them over. Commit-log data travels separately, over the HA port.

So a consumer that fails over to the slave resumes at most 10 s (plus the client's own 5 s commit period)
behind where it stood on the master; the messages in that window are delivered again — the duplicates
the consumer guard absorbs. Offsets committed to the slave while the master is down stay on the slave
until the master is back; the client then commits its in-memory offsets to the master again.

:class:`SyncHandlers` serves requests 43 and 45 on every broker (the master side).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker_sim.common.errors import TransportError
from broker_sim.remoting.client import RemotingConnection
from broker_sim.remoting.codes import RequestCode, ResponseCode
from broker_sim.remoting.errors import RemotingError
from broker_sim.remoting.frame import RemotingCommand
from broker_sim.remoting.server import Connection, Handler

if TYPE_CHECKING:
    from broker_sim.broker.broker import Broker

log = logging.getLogger("broker_sim.remoting.slave_sync")

#: BrokerController: slaveSynchronize.syncAll every 10 s
SYNC_PERIOD_S = 10.0
SYNC_TIMEOUT_S = 3.0


class SyncHandlers:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.GET_ALL_CONSUMER_OFFSET: self.all_consumer_offsets,
            RequestCode.GET_ALL_DELAY_OFFSET: self.all_delay_offsets,
        }

    def all_consumer_offsets(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """ConsumerOffsetSerializeWrapper: ``{"offsetTable": {"topic@group": {"0": offset}}}``."""
        table = {k: {str(q): o for q, o in v.items()} for k, v in self.broker.offsets.snapshot().items()}
        return cmd.reply(ResponseCode.SUCCESS, body=json.dumps({"offsetTable": table}).encode())

    def all_delay_offsets(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """The delayOffset.json content: ``{"offsetTable": {"level": offset}}``."""
        service = self.broker.schedule_service
        table = dict(service.offsets) if service is not None else {}
        body = json.dumps({"offsetTable": {str(k): v for k, v in sorted(table.items())}}).encode()
        return cmd.reply(ResponseCode.SUCCESS, body=body)


class SlaveSynchronize:
    """Pulls the master's metadata into a slave Broker; the master's address comes from a callable (the
    name-server registration result)."""

    def __init__(self, broker: Broker, master_addr: Callable[[], str], period_s: float = SYNC_PERIOD_S):
        self.broker = broker
        self.master_addr = master_addr
        self.period_s = period_s
        self._stop = threading.Event()
        self._conn: RemotingConnection | None = None
        self._conn_addr = ""

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.period_s):
                self.sync_all()

        threading.Thread(target=loop, name="slave-sync", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._conn is not None:
            self._conn.close()

    def _ask(self, code: int) -> dict[str, object]:
        addr = self.master_addr()
        if not addr:
            raise TransportError("master address not known yet")
        if self._conn is None or self._conn_addr != addr:
            if self._conn is not None:
                self._conn.close()
            self._conn, self._conn_addr = RemotingConnection(addr), addr
        reply = self._conn.invoke(RemotingCommand.request(code), SYNC_TIMEOUT_S)
        if reply.code != ResponseCode.SUCCESS:
            raise TransportError(f"master answered {reply.code}: {reply.remark}")
        obj = json.loads(reply.body or b"{}")
        return obj if isinstance(obj, dict) else {}

    def sync_all(self) -> bool:
        """One round (syncAll); False when the master could not be asked (it is retried next period)."""
        from broker_sim.broker.clients import SubscriptionGroupConfig
        from broker_sim.broker.topics import TopicConfig

        b = self.broker
        try:
            topics = self._ask(RequestCode.GET_ALL_TOPIC_CONFIG).get("topicConfigTable") or {}
            offsets = self._ask(RequestCode.GET_ALL_CONSUMER_OFFSET).get("offsetTable") or {}
            delays = self._ask(RequestCode.GET_ALL_DELAY_OFFSET).get("offsetTable") or {}
            groups_reply = self._ask(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
            groups = groups_reply.get("subscriptionGroupTable") or {}
        except (TransportError, RemotingError, ValueError) as exc:
            log.info("slave sync from master skipped: %s", exc)
            return False
        assert isinstance(topics, dict) and isinstance(offsets, dict)
        assert isinstance(delays, dict) and isinstance(groups, dict)
        for d in topics.values():
            tc = TopicConfig.from_json(d)
            if b.topics.select(tc.topic_name) != tc:
                b.topics.update(tc)
        b.offsets.put_all({str(k): {int(q): int(o) for q, o in v.items()} for k, v in offsets.items()})
        b.offsets.persist()
        if b.schedule_service is not None:
            b.schedule_service.offsets.update({int(k): int(v) for k, v in delays.items()})
            b.schedule_service.persist()
        for d in groups.values():
            b.groups.update(SubscriptionGroupConfig.from_json(d))
        return True
