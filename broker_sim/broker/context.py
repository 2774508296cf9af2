"""What a request service may use of the broker that owns it.

The request families (send, pull, delayed delivery, transactions, client registry, client admin) are services
the :class:`~broker_sim.broker.broker.Broker` owns, as RocketMQ's processors are owned by its
``BrokerController``. A service needs the broker's managers and store, never the broker's request surface,
so each one is typed against this protocol rather than against ``Broker``: the services then sit below the
broker that composes them instead of in a loop with it, and mypy checks at each ``Service(self)`` in
``Broker.__init__`` that the broker still offers every member listed here.
"""

from __future__ import annotations

from typing import Protocol

from broker_sim.broker.clients import ConsumerManager, ProducerManager, SubscriptionGroupManager
from broker_sim.broker.config import BrokerConfig
from broker_sim.broker.filtering import SubscriptionFilters
from broker_sim.broker.offsets import ConsumerOffsetManager
from broker_sim.broker.topics import TopicConfigManager
from broker_sim.clock import Clock
from broker_sim.common.message import MessageExt
from broker_sim.common.scheduler import Scheduler
from broker_sim.faults import FaultInjector
from broker_sim.store.message_store import MessageStore


class BrokerContext(Protocol):
    """The broker's parts and the few broker-level operations its request services call."""

    config: BrokerConfig
    clock: Clock
    store: MessageStore
    scheduler: Scheduler
    faults: FaultInjector
    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    offsets: ConsumerOffsetManager
    consumers: ConsumerManager
    producers: ProducerManager
    filters: SubscriptionFilters

    def check_running(self) -> None:
        """Raise ``ServiceNotAvailableError`` unless the broker is running."""

    def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Commit a group's offset (subject to fault injection), as a pull's piggy-backed commit does."""

    def ensure_topic_for_delivery(self, topic: str, queue_id: int) -> None:
        """Create the (retry) topic a delayed delivery lands on, if it does not exist yet."""

    def view_message_by_id(self, offset_msg_id: str) -> MessageExt:
        """The message at the commit-log offset an offset message id encodes."""
