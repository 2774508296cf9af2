"""A seeded fault injector: the failures at-least-once delivery is made of, on demand and repeatable.

One injector belongs to a Broker (``broker.faults``). Faults either arm a rule the broker consults on its
request path (lost send ACKs, lost offset commits, delayed queues) or act at once on a component you pass
(kill a consumer, crash the broker, force a rebalance). Every fault that fires is logged at WARNING and
recorded in :attr:`FaultInjector.events` and :attr:`FaultInjector.counts`, so a test or a report can attribute
each duplicate to its cause. Probabilistic rules draw from ``random.Random(seed)``: same seed, same faults.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
from dataclasses import dataclass
from typing import Protocol

from broker_sim.clock import Clock, SystemClock
from broker_sim.errors import BrokerSimError

log = logging.getLogger(__name__)


class FaultKind(enum.StrEnum):
    LOST_SEND_ACK = "LOST_SEND_ACK"
    LOST_OFFSET_COMMIT = "LOST_OFFSET_COMMIT"
    CONSUMER_KILLED = "CONSUMER_KILLED"
    BROKER_CRASHED = "BROKER_CRASHED"
    FORCED_REBALANCE = "FORCED_REBALANCE"
    QUEUE_DELAYED = "QUEUE_DELAYED"
    MASTER_LOST = "MASTER_LOST"


class FaultInjected(BrokerSimError):
    """Base of the exceptions a fault raises inside a request path."""


class SendAckLost(FaultInjected):
    """The message *was stored*; the transport must now behave as if the reply never came (timeout)."""

    def __init__(self, topic: str, queue_id: int, queue_offset: int) -> None:
        super().__init__(f"send ACK lost for {topic}:{queue_id}@{queue_offset}")
        self.topic, self.queue_id, self.queue_offset = topic, queue_id, queue_offset


@dataclass(frozen=True)
class FaultEvent:
    kind: FaultKind
    at_ms: int
    detail: str


class Killable(Protocol):
    def kill(self) -> None: ...


class Rebalanceable(Protocol):
    def rebalance_now(self) -> None: ...


class Crashable(Protocol):
    def crash(self) -> None: ...


class Cluster(Protocol):
    """A cluster whose brokers are processes (``broker_sim.remoting.cluster_process.ClusterProcess``)."""

    def power_cut(self, name: str, broker_id: int = 0) -> int: ...


class FaultInjector:
    def __init__(self, seed: int = 0, clock: Clock | None = None) -> None:
        self.seed = seed
        self.clock: Clock = clock or SystemClock()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._lost_acks = 0
        self._ack_loss_probability = 0.0
        self._lost_commits = 0
        self._commit_loss_groups: set[str] | None = None
        self._queue_delays: dict[tuple[str, int], int] = {}
        self.events: list[FaultEvent] = []
        self.counts: dict[FaultKind, int] = dict.fromkeys(FaultKind, 0)

    def _record(self, kind: FaultKind, detail: str) -> None:
        # Called with self._lock held or from single-shot actions.
        self.events.append(FaultEvent(kind, self.clock.now_ms(), detail))
        self.counts[kind] += 1
        log.warning("fault injected: %s %s", kind.value, detail)

    # -- armed rules ----------------------------------------------------------------------------------------

    def lose_send_acks(self, n: int = 1, *, probability: float = 0.0) -> None:
        """Drop the reply of the next ``n`` successful sends (and then each with ``probability``)."""
        if n < 0 or not 0.0 <= probability <= 1.0:
            raise ValueError("n must be >= 0 and probability within [0, 1]")
        with self._lock:
            self._lost_acks += n
            self._ack_loss_probability = probability

    def on_send_stored(self, topic: str, queue_id: int, queue_offset: int) -> None:
        """Broker hook after a message is stored: raises :class:`SendAckLost` when a lost ACK is armed."""
        with self._lock:
            fire = self._lost_acks > 0 or (
                self._ack_loss_probability > 0 and self._rng.random() < self._ack_loss_probability
            )
            if not fire:
                return
            if self._lost_acks > 0:
                self._lost_acks -= 1
            self._record(FaultKind.LOST_SEND_ACK, f"{topic}:{queue_id}@{queue_offset}")
        raise SendAckLost(topic, queue_id, queue_offset)

    def lose_offset_commits(self, n: int = 1, *, group: str | None = None) -> None:
        """Silently drop the next ``n`` consumer-offset commits (of ``group``, or of any group)."""
        if n < 0:
            raise ValueError("n must be >= 0")
        with self._lock:
            self._lost_commits += n
            self._commit_loss_groups = None if group is None else {group}

    def drop_offset_commit(self, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """Broker hook before storing a commit: True means "pretend it never arrived"."""
        with self._lock:
            if self._lost_commits <= 0:
                return False
            if self._commit_loss_groups is not None and group not in self._commit_loss_groups:
                return False
            self._lost_commits -= 1
            self._record(FaultKind.LOST_OFFSET_COMMIT, f"{group} {topic}:{queue_id} -> {offset}")
            return True

    def delay_queue(self, topic: str, queue_id: int, delay_ms: int) -> None:
        """Make the queue look empty to pulls for ``delay_ms`` of clock time (a slow or partitioned queue)."""
        with self._lock:
            self._queue_delays[(topic, queue_id)] = self.clock.now_ms() + delay_ms
            self._record(FaultKind.QUEUE_DELAYED, f"{topic}:{queue_id} for {delay_ms} ms")

    def queue_delayed_until(self, topic: str, queue_id: int) -> int:
        """0, or the clock time until which pulls of this queue see nothing."""
        with self._lock:
            until = self._queue_delays.get((topic, queue_id), 0)
            if until and until <= self.clock.now_ms():
                del self._queue_delays[(topic, queue_id)]
                return 0
            return until

    def clear_rules(self) -> None:
        """Disarm every armed rule (lost ACKs/commits, queue delays); counts and events are kept."""
        with self._lock:
            self._lost_acks = 0
            self._ack_loss_probability = 0.0
            self._lost_commits = 0
            self._commit_loss_groups = None
            self._queue_delays.clear()

    # -- immediate actions ----------------------------------------------------------------------------------

    def kill_consumer(self, consumer: Killable) -> None:
        """Stop a consumer abruptly: no offset persist, no unregister (like SIGKILL)."""
        with self._lock:
            self._record(FaultKind.CONSUMER_KILLED, repr(consumer))
        consumer.kill()

    def crash_broker(self, broker: Crashable) -> None:
        """Stop the broker as a power cut would: data not yet flushed (ASYNC_FLUSH) is lost."""
        with self._lock:
            self._record(FaultKind.BROKER_CRASHED, repr(broker))
        broker.crash()

    def lose_master(self, cluster: Cluster, group: str) -> None:
        """Cut the power of ``group``'s master (its slave stays): producers move to other groups, consumers
        read the group from the slave, unreplicated (ASYNC_MASTER) and unflushed data are gone."""
        with self._lock:
            self._record(FaultKind.MASTER_LOST, group)
        cluster.power_cut(group, 0)

    def force_rebalance(self, consumer: Rebalanceable) -> None:
        with self._lock:
            self._record(FaultKind.FORCED_REBALANCE, repr(consumer))
        consumer.rebalance_now()

    def summary(self) -> dict[str, int]:
        with self._lock:
            return {k.value: v for k, v in self.counts.items() if v}
