"""What FIFO consumer groups need from :mod:`reliable.adapters.rocketmq5` beyond the plain path.

A FIFO PushConsumer of the official 5.x client retries a failed message *locally*: it calls the listener
again for the same delivery, up to the group's max attempts, without telling the broker — so the message's
``delivery_attempt`` stays what the broker said (1) and nothing in it shows which local run is the last.
After the last, the client forwards the message to the DLQ itself. The guard must know that run is its
last attempt (or the message leaves with its row ``PENDING``, nobody told): :class:`LocalRuns` counts them.

A SimpleConsumer batch may carry several messages of one message group (an Apache broker's orderly pop
hands out a run of the queue and holds the queue until all are settled). Once one of them is to be
retried, the later ones must not be applied before it: :func:`hold_back` gives them back to come again
with it, in queue order, and :func:`message_group` names the group.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

log = logging.getLogger("reliable.adapters.rocketmq5")

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


def message_group(message: Any) -> str | None:
    """The FIFO message group of a received 5.x message, or None (not sent as a FIFO message)."""
    group = getattr(message, "message_group", None)
    return str(group) if group else None


def hold_back(consumer: Any, message: Any, delay_s: int) -> None:
    """Give ``message`` back unhandled, invisible for ``delay_s`` (its message group's failed message's retry
    delay), so it comes again after that one: applied now, it would overtake it. A failed change leaves it to
    come back after its invisible time — still behind the failed message, which the broker holds its message
    group for."""
    try:
        consumer.change_invisible_duration(message, delay_s)
    except Exception:
        log.exception(
            "could not hold %s back behind its message group's failed message; it comes back after its"
            " invisible time",
            message.message_id,
        )
