"""Rebalancing for the push consumer (RocketMQ's ``RebalanceImpl``): which queues this client owns.

At start, every 20 s and whenever the broker reports a membership change, the client lists the topic's
queues and the group's client ids, runs the allocation strategy, and reconciles its process queues:
a queue it no longer owns is *dropped* (listeners still running on it have their results ignored) after its
offset is committed one last time; a new queue starts from the group's committed offset (or the
CONSUME_FROM_* policy for a new group). The gap between "dropped" and "the new owner's first pull" is where
rebalance duplicates come from.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from broker_sim.client.offset_store import ReadOffsetType
from broker_sim.client.process_queue import ProcessQueue
from broker_sim.common.constants import is_retry_topic
from broker_sim.common.errors import BrokerResponseError, TransportError
from broker_sim.common.message import MessageQueue
from broker_sim.common.requests import ConsumeFromWhere, MessageModel, Perm

if TYPE_CHECKING:
    from broker_sim.client.allocate import Allocator
    from broker_sim.client.offset_store import OffsetStore
    from broker_sim.clock import Clock
    from broker_sim.common.requests import SubscriptionData
    from broker_sim.common.scheduler import Scheduler
    from broker_sim.common.transport import BrokerTransport

log = logging.getLogger("broker_sim.client.push_consumer")


@dataclass
class PullRequest:
    mq: MessageQueue
    pq: ProcessQueue
    next_offset: int
    locked_first: bool = False


class RebalanceHost(Protocol):
    """What the rebalancer reads and changes on the push consumer that owns it."""

    group: str
    client_id: str
    transport: BrokerTransport
    clock: Clock
    stopped: bool
    message_model: MessageModel
    consume_from_where: ConsumeFromWhere
    consume_timestamp_ms: int | None
    allocate: Allocator
    subscriptions: dict[str, SubscriptionData]
    process_queues: dict[MessageQueue, ProcessQueue]
    offset_store: OffsetStore
    pq_lock: threading.RLock
    pull_queue: queue.Queue[PullRequest | None]
    scheduler: Scheduler

    @property
    def orderly(self) -> bool: ...


class Rebalancer:
    """The push consumer's rebalance service (``consumer.rebalancer``), over the consumer's queues."""

    def __init__(self, host: RebalanceHost) -> None:
        self.host = host
        self.rebalance_count = 0
        self._lock = threading.Lock()

    def rebalance_now(self) -> None:
        """Recompute this client's queues now (also runs at start, every 20 s and on membership change)."""
        if self.host.stopped:
            return
        with self._lock:
            self.rebalance_count += 1
            for topic in list(self.host.subscriptions):
                try:
                    self._rebalance_topic(topic)
                except (TransportError, BrokerResponseError) as exc:
                    log.warning("%s: rebalance of %s failed: %s", self.host.group, topic, exc)

    def _topic_queues(self, topic: str) -> list[MessageQueue]:
        route = self.host.transport.get_route(topic)
        out: list[MessageQueue] = []
        for qd in route.queue_datas:
            if qd.perm & Perm.READ:
                out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
        return sorted(out)

    def _rebalance_topic(self, topic: str) -> None:
        mqs = self._topic_queues(topic)
        if self.host.message_model is MessageModel.BROADCASTING:
            wanted = mqs
        else:
            cids = self.host.transport.get_consumer_list(self.host.group, topic)
            if not cids:
                log.warning("%s: no consumer ids from the broker for %s", self.host.group, topic)
                return
            wanted = self.host.allocate(self.host.group, self.host.client_id, mqs, cids)
        self._update_process_queues(topic, set(wanted))

    def _update_process_queues(self, topic: str, wanted: set[MessageQueue]) -> None:
        new_requests: list[PullRequest] = []
        with self.host.pq_lock:
            for mq in [m for m in self.host.process_queues if m.topic == topic and m not in wanted]:
                pq = self.host.process_queues.pop(mq)
                pq.dropped = True
                self._remove_unnecessary(mq, pq)
                log.info("%s: %s dropped from %s by rebalance", self.host.group, mq, self.host.client_id)
            for mq in sorted(wanted - set(self.host.process_queues)):
                if (
                    self.host.orderly
                    and self.host.message_model is MessageModel.CLUSTERING
                    and not self.lock_one(mq)
                ):
                    continue
                self.host.offset_store.remove_offset(mq)
                offset = self.compute_pull_from_where(mq)
                if offset < 0:
                    log.warning(
                        "%s: no start offset for %s; will retry at next rebalance", self.host.group, mq
                    )
                    continue
                pq = ProcessQueue()
                if self.host.orderly and self.host.message_model is MessageModel.CLUSTERING:
                    pq.locked, pq.last_lock_ms = True, self.host.clock.now_ms()
                self.host.process_queues[mq] = pq
                new_requests.append(PullRequest(mq, pq, offset, locked_first=True))
                log.info(
                    "%s: %s assigned to %s from offset %d", self.host.group, mq, self.host.client_id, offset
                )
        for pr in new_requests:
            self.host.pull_queue.put(pr)

    def restart_queues(self, topic: str, offsets: dict[MessageQueue, int]) -> None:
        """After an offset reset: drop the owned queues of ``topic`` and pull them again from ``offsets``."""
        h = self.host
        requests = []
        with h.pq_lock:
            for mq in [m for m in h.process_queues if m.topic == topic and m in offsets]:
                old = h.process_queues.pop(mq)
                old.dropped = True
                pq = ProcessQueue()
                pq.locked, pq.last_lock_ms = old.locked, old.last_lock_ms
                h.process_queues[mq] = pq
                requests.append(PullRequest(mq, pq, offsets[mq], locked_first=True))
        for pr in requests:
            h.pull_queue.put(pr)

    # -- orderly queue locks (RebalanceImpl.lock / lockAll) ------------------------------------------------

    def lock_all(self) -> None:
        """Renew the broker locks of every owned queue (every 20 s); a queue whose lock is refused stops."""
        h = self.host
        with h.pq_lock:
            mqs = set(h.process_queues)
        if not mqs or h.stopped:
            return
        try:
            locked = h.transport.lock_batch_mq(h.group, h.client_id, mqs)
        except (TransportError, BrokerResponseError) as exc:
            log.warning("%s: lock batch failed: %s", h.group, exc)
            return
        now = h.clock.now_ms()
        with h.pq_lock:
            for mq, pq in h.process_queues.items():
                if mq in locked:
                    if not pq.locked:
                        log.info("%s: queue %s locked", h.group, mq)
                    pq.locked, pq.last_lock_ms = True, now
                else:
                    pq.locked = False

    def lock_one(self, mq: MessageQueue) -> bool:
        h = self.host
        try:
            locked = mq in h.transport.lock_batch_mq(h.group, h.client_id, {mq})
        except (TransportError, BrokerResponseError) as exc:
            log.warning("%s: lock %s failed: %s", h.group, mq, exc)
            return False
        with h.pq_lock:
            pq = h.process_queues.get(mq)
            if pq is not None and locked:
                pq.locked, pq.last_lock_ms = True, h.clock.now_ms()
        return locked

    def try_lock_later(self, mq: MessageQueue, then: Callable[[], None]) -> None:
        """Lock ``mq`` soon (retrying every 3 s while refused), then run ``then``."""
        h = self.host

        def attempt() -> None:
            if h.stopped:
                return
            if self.lock_one(mq):
                h.scheduler.schedule(10, then, name="orderly-resume")
            else:
                h.scheduler.schedule(3000, attempt, name="orderly-relock")

        h.scheduler.schedule(10, attempt, name="orderly-lock")

    def _remove_unnecessary(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        self.host.offset_store.persist(mq)
        self.host.offset_store.remove_offset(mq)
        # Orderly: unlock only when no listener of this queue runs; otherwise the lock expires on the broker.
        if (
            self.host.orderly
            and self.host.message_model is MessageModel.CLUSTERING
            and pq.consume_lock.acquire(timeout=1.0)
        ):
            try:
                self.host.transport.unlock_batch_mq(self.host.group, self.host.client_id, {mq})
            finally:
                pq.consume_lock.release()

    def compute_pull_from_where(self, mq: MessageQueue) -> int:
        """The committed offset, or for a new group the CONSUME_FROM_* policy; -1 if it cannot be known."""
        last = self.host.offset_store.read_offset(mq, ReadOffsetType.READ_FROM_STORE)
        if last >= 0:
            return last
        if last != -1:
            return -1
        cfw = self.host.consume_from_where
        try:
            if is_retry_topic(mq.topic) or cfw is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
                return 0
            if cfw is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
                ts = (
                    self.host.consume_timestamp_ms
                    if self.host.consume_timestamp_ms is not None
                    else self.host.clock.now_ms() - 1_800_000
                )
                return self.host.transport.search_offset_by_timestamp(
                    mq.topic, mq.queue_id, ts, mq.broker_name
                )
            return self.host.transport.get_max_offset(mq.topic, mq.queue_id, mq.broker_name)
        except (TransportError, BrokerResponseError) as exc:
            log.warning("%s: start offset of %s unknown: %s", self.host.group, mq, exc)
            return -1
