"""Where each broker group's master and slaves are, as a client learns it from the name server
(MQClientInstance.brokerAddrTable): from cluster info and from every topic route it fetches.

Writes (sends, heartbeats) go to a group's master only. Reads (pulls, offsets) go to the master while the
name server lists one and to the group's slave otherwise (``findBrokerAddressInSubscribe`` with the
master absent). A connection failure forgets that address at once, so the next request asks the name
server again — the Java client only re-reads routes every 30 s (``pollNameServerInterval``); broker_sim
fails over sooner so tests and the demo need not wait that long.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

MASTER_ID = 0


class BrokerDirectory:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, dict[int, str]] = {}

    def replace(self, groups: Mapping[str, Mapping[int, str]]) -> None:
        """The name server's whole view (cluster info): a group or address it no longer lists is gone."""
        with self._lock:
            self._groups = {n: dict(a) for n, a in groups.items() if a}

    def update(self, name: str, addrs: Mapping[int, str]) -> None:
        """One group as a topic route lists it."""
        with self._lock:
            if addrs:
                self._groups[name] = dict(addrs)
            else:
                self._groups.pop(name, None)

    def forget(self, addr: str) -> None:
        with self._lock:
            for name in list(self._groups):
                group = {i: a for i, a in self._groups[name].items() if a != addr}
                if group:
                    self._groups[name] = group
                else:
                    del self._groups[name]

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
        """The master of ``name`` if listed, else its lowest-id slave."""
        with self._lock:
            group = self._groups.get(name, {})
            return group[min(group)] if group else None

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
