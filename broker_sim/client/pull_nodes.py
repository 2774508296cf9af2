"""Which node of a broker group each queue is pulled from next (RocketMQ's ``PullAPIWrapper``
``pullFromWhichNodeTable``).

Every pull reply names a node (``suggestWhichBrokerId``): a master whose reader fell behind its memory share
names a slave, a slave whose reader caught up names the master again. The consumer records the suggestion
per queue and sends the queue's next pull there; a queue never answered is pulled from the master. Keeping
this per consumer (not in the transport) is what Java does: two consumers of one client may read the same
group from different nodes.
"""

from __future__ import annotations

import threading

from broker_sim.common.message import MessageQueue

MASTER_ID = 0


class PullNodeTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[MessageQueue, int] = {}

    def update(self, mq: MessageQueue, suggested: int) -> None:
        """``updatePullFromWhichNode``: the node the last reply about ``mq`` suggested."""
        with self._lock:
            self._nodes[mq] = suggested

    def node(self, mq: MessageQueue) -> int:
        """``recalculatePullFromWhichNode``: where ``mq`` is pulled from next (the master by default)."""
        with self._lock:
            return self._nodes.get(mq, MASTER_ID)
