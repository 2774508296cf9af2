"""What FIFO consumer groups need from :mod:`reliable.adapters.rocketmq5` beyond the plain path.

A FIFO PushConsumer of the official 5.x client retries a failed message *locally*: it calls the listener
again for the same delivery, up to the group's max attempts, without telling the broker — so the message's
``delivery_attempt`` stays what the broker said (1) and nothing in it shows which local run is the last.
After the last, the client forwards the message to the DLQ itself. The guard must know that run is its
last attempt (or the message leaves with its row ``PENDING``, nobody told): :class:`LocalRuns` counts them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

#: deliveries whose local runs are remembered at most (the client may drop a delivery without a last run)
MAX_TRACKED = 4096


class LocalRuns:
    """How many times the listener has run each delivery of a FIFO PushConsumer (thread-safe: the client
    consumes different message groups on different threads).

    A delivery is (message id, delivery attempt): the client's local retries keep both, a redelivery by
    the broker has a higher attempt and is counted afresh (the client retries it locally again). The
    receipt handle is no key: extending the invisible time replaces it between runs."""

    def __init__(self, max_tracked: int = MAX_TRACKED) -> None:
        self._runs: OrderedDict[tuple[str, int], int] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_tracked

    @staticmethod
    def _key(message: Any) -> tuple[str, int]:
        return (str(message.message_id), int(message.delivery_attempt or 1))

    def start(self, message: Any) -> int:
        """Count one more run of ``message``'s delivery; returns its number (1 = the first)."""
        key = self._key(message)
        with self._lock:
            n = self._runs.pop(key, 0) + 1
            self._runs[key] = n
            while len(self._runs) > self._max:
                self._runs.popitem(last=False)
            return n

    def forget(self, message: Any) -> None:
        """The delivery is over (consumed, dead-lettered, or its last local run done)."""
        with self._lock:
            self._runs.pop(self._key(message), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._runs)
