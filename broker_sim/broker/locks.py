"""Broker-side queue locks for orderly consumption (``RebalanceLockManager``).

Only the client holding a queue's lock may consume it in order. A lock lasts ``lock_expiry_ms`` (60 s) after
its last renewal; the owner renews every 20 s, so a crashed owner's queues become free within a minute and a
live owner never loses them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from broker_sim.common.message import MessageQueue


class RebalanceLockManager:
    def __init__(self, now_ms: Callable[[], int], lock_expiry_ms: int = 60_000) -> None:
        self._now = now_ms
        self.lock_expiry_ms = lock_expiry_ms
        self._lock = threading.Lock()
        self._table: dict[str, dict[MessageQueue, tuple[str, int]]] = {}

    def try_lock_batch(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> set[MessageQueue]:
        now = self._now()
        locked: set[MessageQueue] = set()
        with self._lock:
            table = self._table.setdefault(group, {})
            for mq in mqs:
                holder = table.get(mq)
                if holder is None or holder[0] == client_id or now - holder[1] > self.lock_expiry_ms:
                    table[mq] = (client_id, now)
                    locked.add(mq)
        return locked

    def unlock_batch(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> None:
        with self._lock:
            table = self._table.get(group, {})
            for mq in mqs:
                holder = table.get(mq)
                if holder is not None and holder[0] == client_id:
                    del table[mq]

    def holder(self, group: str, mq: MessageQueue) -> str | None:
        now = self._now()
        with self._lock:
            holder = self._table.get(group, {}).get(mq)
            if holder is None or now - holder[1] > self.lock_expiry_ms:
                return None
            return holder[0]
