"""A broker's registration with its name servers (RocketMQ 4.9.8 ``BrokerController.registerBrokerAll`` and
``BrokerOuterAPI``).

The broker sends REGISTER_BROKER to *every* name server: at start (before it reports itself ready), every
``registerNameServerPeriod`` = 30 s, and at once when its topic table changes (a topic created by a send,
by a consumer's send-back or by an admin). UNREGISTER_BROKER goes to each at a clean shutdown. One
connection per name server is kept open, so a broker that dies is also noticed when that connection closes.

The body is RegisterBrokerBody as JSON (``compressed`` false, Java's default ``compressedRegister``):
``{"topicConfigSerializeWrapper": {"topicConfigTable": …, "dataVersion": …}, "filterServerList": []}``.
The data version's counter moves whenever the table differs from the one last sent; a name server
rewrites its queue data only when it does. A failed name server is logged and retried next period; the
others are not held up by it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from broker_sim.clock import Clock, SystemClock
from broker_sim.common.errors import TransportError
from broker_sim.namesrv.processor import body_crc32
from broker_sim.remoting.client import RemotingConnection
from broker_sim.remoting.codes import RequestCode, ResponseCode
from broker_sim.remoting.errors import RemotingError
from broker_sim.remoting.frame import RemotingCommand

log = logging.getLogger("broker_sim.remoting.registration")

#: BrokerConfig.registerNameServerPeriod
REGISTER_PERIOD_S = 30.0
#: BrokerConfig.registerBrokerTimeoutMills
REGISTER_TIMEOUT_S = 6.0


class LocalNameServer(Protocol):
    def handle(self, cmd: RemotingCommand) -> RemotingCommand: ...


@dataclass(frozen=True)
class BrokerIdentity:
    cluster: str
    broker_name: str
    broker_id: int
    broker_addr: str
    ha_server_addr: str = ""


class NameServerRegistrar:
    """Keeps one broker registered with a list of name servers."""

    def __init__(
        self,
        identity: BrokerIdentity,
        namesrv_addrs: Sequence[str],
        topic_table: Callable[[], dict[str, dict[str, Any]]],
        *,
        period_s: float = REGISTER_PERIOD_S,
        clock: Clock | None = None,
        local: LocalNameServer | None = None,
    ) -> None:
        self.identity = identity
        self.namesrv_addrs = list(namesrv_addrs)
        self.topic_table = topic_table
        self.period_s = period_s
        self.clock: Clock = clock or SystemClock()
        self._conns = {a: RemotingConnection(a) for a in self.namesrv_addrs}
        #: a name server in this process (``broker-sim serve``), called directly: registered before it
        #: accepts its first client, so no client ever sees it without this broker
        self.local = local
        self._lock = threading.Lock()
        self._last_table: dict[str, dict[str, Any]] | None = None
        self._version = {"timestamp": 0, "counter": 0}
        self._stop = threading.Event()
        #: what the last successful registration answered (a slave learns its master here)
        self.master_addr = ""
        self.master_ha_addr = ""
        #: called with (master address, master HA address) after each registration that named them
        self.on_master: Callable[[str, str], None] | None = None

    def _header(self) -> dict[str, object]:
        i = self.identity
        return {
            "brokerName": i.broker_name,
            "brokerAddr": i.broker_addr,
            "clusterName": i.cluster,
            "brokerId": i.broker_id,
        }

    def _body(self) -> bytes:
        table = self.topic_table()
        if table != self._last_table:
            self._last_table = table
            self._version = {"timestamp": self.clock.now_ms(), "counter": self._version["counter"] + 1}
        wrapper = {"topicConfigTable": table, "dataVersion": self._version}
        return json.dumps({"topicConfigSerializeWrapper": wrapper, "filterServerList": []}).encode()

    def _targets(self) -> list[tuple[str, Callable[[RemotingCommand], RemotingCommand]]]:
        def remote(conn: RemotingConnection) -> Callable[[RemotingCommand], RemotingCommand]:
            return lambda cmd: conn.invoke(cmd, REGISTER_TIMEOUT_S)

        out = [(addr, remote(conn)) for addr, conn in self._conns.items()]
        if self.local is not None:
            out.insert(0, ("(this process)", self.local.handle))
        return out

    def register_all(self) -> int:
        """REGISTER_BROKER to every name server; returns how many accepted it."""
        with self._lock:
            body = self._body()
            fields = {
                **self._header(),
                "haServerAddr": self.identity.ha_server_addr,
                "compressed": "false",
                "bodyCrc32": body_crc32(body),
            }
            ok = 0
            for addr, invoke in self._targets():
                cmd = RemotingCommand.request(RequestCode.REGISTER_BROKER, fields, body)
                try:
                    reply = invoke(cmd)
                except (TransportError, RemotingError) as exc:
                    log.warning("register with name server %s failed: %s", addr, exc)
                    continue
                if reply.code != ResponseCode.SUCCESS:
                    log.warning("name server %s refused the registration: %s", addr, reply.remark)
                    continue
                ok += 1
                master = reply.ext_fields.get("masterAddr", "")
                if master:
                    self.master_addr = master
                    self.master_ha_addr = reply.ext_fields.get("haServerAddr", "")
            if self.master_addr and self.on_master is not None:
                self.on_master(self.master_addr, self.master_ha_addr)
            return ok

    def unregister_all(self) -> None:
        with self._lock:
            for addr, invoke in self._targets():
                cmd = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, self._header())
                try:
                    invoke(cmd)
                except (TransportError, RemotingError) as exc:
                    log.warning("unregister from name server %s failed: %s", addr, exc)

    def start(self) -> None:
        """Register once now, then every period on a daemon thread."""
        self.register_all()

        def loop() -> None:
            while not self.clock.wait(self._stop, self.period_s):
                self.register_all()

        threading.Thread(target=loop, name="namesrv-register", daemon=True).start()

    def shutdown(self, *, unregister: bool = True) -> None:
        self._stop.set()
        if unregister:
            self.unregister_all()
        for conn in self._conns.values():
            conn.close()
