"""Where each broker group's master and slaves are, as a client learns it from the name server
(MQClientInstance.brokerAddrTable): from cluster info and from every topic route it fetches.

Writes (sends, heartbeats) go to a group's master only. Reads (pulls, offsets) go to the master while the
name server lists one and to the group's slave otherwise (``findBrokerAddressInSubscribe`` with the
master absent). A connection failure forgets that address at once, so the next request asks the name
server again — the Java client only re-reads routes every 30 s (``pollNameServerInterval``); broker_sim
fails over sooner so tests and the demo need not wait that long.

A failed address is also remembered for :data:`SUSPECT_S` seconds (:meth:`BrokerDirectory.healthy_first`):
a hung master (SIGSTOP, a black-holed host) keeps being listed by the name server until its 120 s expiry, and
a request that may go to any of several brokers (consumer list, client config check) tries it last meanwhile,
and a read goes to its slave. A failed address the name server dropped (the broker's connection closed) and
lists again is a restarted broker: it is not suspect any more.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping

MASTER_ID = 0
#: how long an address that failed a request is tried after the others (the Java client's route poll, 30 s)
SUSPECT_S = 30.0


class BrokerDirectory:
    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, dict[int, str]] = {}
        self._monotonic = monotonic
        #: address -> when a request to it last failed
        self._failed_at: dict[str, float] = {}
        #: failed addresses the name server's whole view has not listed since (a broker that went away)
        self._gone: set[str] = set()

    def replace(self, groups: Mapping[str, Mapping[int, str]]) -> None:
        """The name server's whole view (cluster info): a group or address it no longer lists is gone."""
        listed = {a for addrs in groups.values() for a in addrs.values()}
        with self._lock:
            self._groups = {n: dict(a) for n, a in groups.items() if a}
            self._gone |= self._failed_at.keys() - listed
            self._back(listed)

    def update(self, name: str, addrs: Mapping[int, str]) -> None:
        """One group as a topic route lists it."""
        with self._lock:
            self._back(set(addrs.values()))
            if addrs:
                self._groups[name] = dict(addrs)
            else:
                self._groups.pop(name, None)

    def _back(self, listed: set[str]) -> None:
        """A failed address the name server had dropped and lists again registered anew (a restarted
        broker): no longer suspect. One it listed all along (a hung broker) stays suspect. Lock held."""
        for addr in self._gone & listed:
            self._gone.discard(addr)
            self._failed_at.pop(addr, None)

    def forget(self, addr: str) -> None:
        """``addr`` failed a request: drop it until the name server lists it again, and try it last for
        :data:`SUSPECT_S` seconds after that."""
        with self._lock:
            self._failed_at[addr] = self._monotonic()
            for name in list(self._groups):
                group = {i: a for i, a in self._groups[name].items() if a != addr}
                if group:
                    self._groups[name] = group
                else:
                    del self._groups[name]

    def healthy_first(self, addrs: Iterable[str]) -> list[str]:
        """``addrs`` in their order, the ones that failed a request within :data:`SUSPECT_S` s moved last."""
        with self._lock:
            now = self._monotonic()
            suspect = {a for a, at in self._failed_at.items() if now - at < SUSPECT_S}
        ordered = list(addrs)
        return [a for a in ordered if a not in suspect] + [a for a in ordered if a in suspect]

    def empty(self) -> bool:
        with self._lock:
            return not self._groups

    def master(self, name: str | None = None) -> str | None:
        """The master of ``name`` (of the first group with one, for ``None``)."""
        with self._lock:
            if name is not None:
                return self._groups.get(name, {}).get(MASTER_ID)
            for n in sorted(self._groups):
                if MASTER_ID in self._groups[n]:
                    return self._groups[n][MASTER_ID]
            return None

    def reader(self, name: str) -> str | None:
        """The master of ``name`` if listed, else its lowest-id slave; a node that failed a request within
        :data:`SUSPECT_S` s after the others (a hung master the name server still lists is not read every
        time while its slave answers)."""
        with self._lock:
            group = self._groups.get(name, {})
            nodes = [group[i] for i in sorted(group)]
        ordered = self.healthy_first(nodes)
        return ordered[0] if ordered else None

    def in_subscribe(self, name: str, broker_id: int) -> tuple[str, bool] | None:
        """``findBrokerAddressInSubscribe(name, broker_id, onlyThisBroker=false)``: the node ``broker_id``
        of ``name``; for a slave id that is not listed, the next id; else any listed node (the master
        first). Returns the address and whether it is a slave, or None when the group is unknown."""
        with self._lock:
            group = dict(self._groups.get(name, {}))
        if not group:
            return None
        for bid in (broker_id, broker_id + 1) if broker_id != MASTER_ID else (broker_id,):
            if bid in group:
                return group[bid], bid != MASTER_ID
        first = min(group)
        return group[first], first != MASTER_ID

    def masters(self) -> list[str]:
        with self._lock:
            return sorted({g[MASTER_ID] for g in self._groups.values() if MASTER_ID in g})

    def name_of(self, addr: str) -> str:
        with self._lock:
            for name, group in self._groups.items():
                if addr in group.values():
                    return name
        return ""
