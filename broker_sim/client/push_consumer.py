"""The push consumer: rebalance, long-polling pull loop, process queues, consume service, offset commits.

Life of a queue: a rebalance assigns it (start offset = the group's committed offset, or the
CONSUME_FROM_* policy for a new group) → the pull loop long-polls the broker, 32 messages at a time, and hands
them to the consume service → the listener's answers move the queue's commit offset (smallest unfinished) →
offsets reach the broker piggy-backed on pulls and every 5 s → a rebalance that takes the queue away drops
its process queue (results of listeners still running are ignored) and commits its offset once more.
Each step is a place where messages get delivered twice, and each is reproduced here on purpose.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path

from broker_sim.client.allocate import Allocator, average
from broker_sim.client.client_base import ClientBase, check_group
from broker_sim.client.consume_service import (
    ConcurrentConsumeService,
    MessageListener,
    OrderlyConsumeService,
    OrderlyListener,
)
from broker_sim.client.consumer_admin import ConsumerAdmin
from broker_sim.client.offset_store import (
    LocalFileOffsetStore,
    OffsetStore,
    RemoteBrokerOffsetStore,
)
from broker_sim.client.process_queue import ProcessQueue
from broker_sim.client.pull_nodes import PullNodeTable
from broker_sim.client.pull_service import PullService
from broker_sim.client.rebalance import PullRequest, Rebalancer
from broker_sim.client.send_back import InnerProducer, try_send_back
from broker_sim.clock import Clock
from broker_sim.common.constants import parse_tag_expression, retry_topic
from broker_sim.common.errors import BrokerResponseError, ClientStateError, TransportError
from broker_sim.common.message import MessageExt, MessageQueue
from broker_sim.common.requests import (
    ConsumeFromWhere,
    ConsumerData,
    ConsumeType,
    ExpressionType,
    HeartbeatData,
    MessageModel,
    MessageSelector,
    SubscriptionData,
)
from broker_sim.common.scheduler import Scheduler
from broker_sim.common.service_state import ServiceState

log = logging.getLogger(__name__)


class PushConsumer(ClientBase):
    """``PushConsumer(broker_or_address, group).subscribe(topic, "*", listener); consumer.start()``."""

    def __init__(
        self,
        broker_or_address: object,
        group: str,
        *,
        message_model: MessageModel = MessageModel.CLUSTERING,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_timestamp_ms: int | None = None,
        allocate: Allocator = average,
        consume_threads: int = 20,
        consume_message_batch_max_size: int = 1,
        pull_batch_size: int = 32,
        pull_threshold_for_queue: int = 1000,
        pull_threshold_size_for_queue_mib: int = 100,
        consume_concurrently_max_span: int = 2000,
        max_reconsume_times: int = 16,
        consume_timeout_ms: int = 15 * 60_000,
        suspend_current_queue_time_ms: int = 1000,
        persist_consumer_offset_interval_ms: int = 5000,
        rebalance_interval_ms: int = 20_000,
        heartbeat_interval_ms: int = 30_000,
        pull_time_delay_ms_when_exception: int = 3000,
        broker_suspend_max_time_ms: int = 15_000,
        local_offset_dir: str | Path | None = None,
        instance_name: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        check_group(group)
        super().__init__(broker_or_address, clock=clock, instance_name=instance_name)
        self.inner_producer = InnerProducer(broker_or_address, self.clock)  # retry copies (send_back)
        self.group = group
        self.message_model = message_model
        self.consume_from_where = consume_from_where
        self.consume_timestamp_ms = consume_timestamp_ms
        self.allocate = allocate
        self.consume_threads = consume_threads
        self.consume_message_batch_max_size = consume_message_batch_max_size
        self.pull_batch_size = pull_batch_size
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.pull_threshold_size_for_queue = pull_threshold_size_for_queue_mib * 1024 * 1024
        self.consume_concurrently_max_span = consume_concurrently_max_span
        self.max_reconsume_times = max_reconsume_times
        #: the node of each queue's group the next pull goes to (the last reply's suggestion)
        self.pull_nodes = PullNodeTable()
        self.consume_timeout_ms = consume_timeout_ms
        self.suspend_current_queue_time_ms = suspend_current_queue_time_ms
        self.persist_consumer_offset_interval_ms = persist_consumer_offset_interval_ms
        self.rebalance_interval_ms = rebalance_interval_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.pull_time_delay_ms_when_exception = pull_time_delay_ms_when_exception
        self.broker_suspend_max_time_ms = broker_suspend_max_time_ms
        # Names the local offsets file of a broadcasting consumer. RocketMQ keeps the instance name "DEFAULT"
        # for broadcasting consumers, so a restarted process finds its offsets again; pass instance_name to
        # run several broadcasting consumers of one group in one process.
        self.instance_name = instance_name or (
            "DEFAULT" if message_model is MessageModel.BROADCASTING else self.client_id
        )
        self._local_offset_dir = (
            Path(local_offset_dir) if local_offset_dir else Path.home() / ".rocketmq_offsets"
        )
        self.subscriptions: dict[str, SubscriptionData] = {}
        self.tag_filters: dict[str, frozenset[str] | None] = {}
        self._listener: MessageListener | None = None
        self._orderly_listener: OrderlyListener | None = None
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self.pq_lock = threading.RLock()
        self.pull_queue: queue.Queue[PullRequest | None] = queue.Queue()
        self.offset_store: OffsetStore = (
            RemoteBrokerOffsetStore(self.transport, group)
            if message_model is MessageModel.CLUSTERING
            else LocalFileOffsetStore(self._local_offset_dir, self.instance_name, group)
        )
        self.consume_service: ConcurrentConsumeService | OrderlyConsumeService | None = None
        self.scheduler: Scheduler = Scheduler(self.clock, f"consumer-{group}")
        self.stopped = False
        self._state: ServiceState = ServiceState.CREATED
        self.flow_control_times = 0
        self.pulls = PullService(self)
        self.rebalancer = Rebalancer(self)
        self.admin = ConsumerAdmin(self)
        self.start_timestamp_ms = 0
        self._pull_thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"PushConsumer({self.group!r}, {self.client_id!r})"

    @property
    def is_running(self) -> bool:
        return self._state == ServiceState.RUNNING

    def listener_for_direct_consume(self) -> Callable[[list[MessageExt]], object]:
        listener = self._orderly_listener or self._listener
        if listener is None:
            raise ClientStateError(f"consumer {self.group} has no listener")
        return listener

    def rebalance_now(self) -> None:
        """Recompute this client's queues now (also runs at start, every 20 s and on membership change)."""
        self.rebalancer.rebalance_now()

    @property
    def rebalance_count(self) -> int:
        return self.rebalancer.rebalance_count

    @property
    def orderly(self) -> bool:
        return self._orderly_listener is not None

    # -- configuration --------------------------------------------------------------------------------------

    def subscribe(
        self, topic: str, expression: str | MessageSelector = "*", listener: MessageListener | None = None
    ) -> PushConsumer:
        """Subscribe to ``topic`` with a tag expression (``"*"``, ``"A || B"``) or a
        ``MessageSelector.by_sql("a > 5")``; optionally set the listener. SQL92 subscriptions are checked with
        the broker at ``start()`` (CHECK_CLIENT_CONFIG), which raises if the broker cannot serve them."""
        if self._state != ServiceState.CREATED:
            raise ClientStateError("subscribe before start()")
        selector = MessageSelector.of(expression)
        sql = selector.expression_type is ExpressionType.SQL92
        self.tag_filters[topic] = None if sql else parse_tag_expression(selector.expression)
        self.subscriptions[topic] = SubscriptionData(
            topic, selector.expression, self.clock.now_ms(), selector.expression_type
        )
        if listener is not None:
            self.register_message_listener(listener)
        return self

    def register_message_listener(self, listener: MessageListener) -> None:
        """A concurrent listener: ``listener(msgs) -> ConsumeStatus``."""
        self._listener, self._orderly_listener = listener, None

    def register_message_listener_orderly(self, listener: OrderlyListener) -> None:
        """An orderly listener: ``listener(msgs) -> ConsumeOrderlyStatus``; one thread per queue, in order."""
        self._orderly_listener, self._listener = listener, None

    # -- life cycle -----------------------------------------------------------------------------------------

    def start(self) -> PushConsumer:
        if self._state != ServiceState.CREATED:
            raise ClientStateError(f"consumer {self.group} is {self._state}")
        if self._listener is None and self._orderly_listener is None:
            raise ClientStateError("register a message listener before start()")
        if not self.subscriptions:
            raise ClientStateError("subscribe to a topic before start()")
        if self.message_model is MessageModel.CLUSTERING:
            rt = retry_topic(self.group)
            self.subscriptions[rt] = SubscriptionData(rt, "*", self.clock.now_ms())
            self.tag_filters[rt] = None
        self.admin.check_client_config()
        self.start_timestamp_ms = self.clock.now_ms()
        self.offset_store.load()
        if self._orderly_listener is not None:
            self.consume_service = OrderlyConsumeService(self, self._orderly_listener, self.consume_threads)
        else:
            assert self._listener is not None
            self.consume_service = ConcurrentConsumeService(self, self._listener, self.consume_threads)
        self._state = ServiceState.RUNNING
        self._pull_thread = threading.Thread(target=self.pulls.run, name=f"pull-{self.group}", daemon=True)
        self._pull_thread.start()
        self.send_heartbeat()
        self.rebalancer.rebalance_now()
        s = self.scheduler
        s.schedule_periodic(
            self.rebalance_interval_ms,
            self.rebalance_interval_ms,
            self.rebalancer.rebalance_now,
            name="rebalance",
        )
        s.schedule_periodic(
            self.heartbeat_interval_ms, self.heartbeat_interval_ms, self.send_heartbeat, name="heartbeat"
        )
        s.schedule_periodic(
            self.persist_consumer_offset_interval_ms,
            self.persist_consumer_offset_interval_ms,
            self.persist_offsets,
            name="persist-offsets",
        )
        if self.orderly and self.message_model is MessageModel.CLUSTERING:
            s.schedule_periodic(1000, 20_000, self.rebalancer.lock_all, name="lock-all")
        if isinstance(self.consume_service, ConcurrentConsumeService):
            s.schedule_periodic(
                self.consume_timeout_ms, self.consume_timeout_ms, self._clean_expired, name="clean-expired"
            )
        return self

    def shutdown(self) -> None:
        """Graceful stop: no new listener calls; the running ones finish and their results move the offsets;
        then persist offsets, unlock queues, unregister (the group rebalances at once)."""
        if self._state != ServiceState.RUNNING:
            self._state = ServiceState.SHUTDOWN
            return
        self._state = ServiceState.SHUTDOWN
        self.stopped = True
        self.scheduler.shutdown()
        self.pull_queue.put(None)
        assert self.consume_service is not None
        self.consume_service.shutdown(wait=True)
        with self.pq_lock:
            mqs = list(self.process_queues)
            for pq in self.process_queues.values():
                pq.dropped = True
        self.offset_store.persist_all(mqs)
        if self.orderly and self.message_model is MessageModel.CLUSTERING and mqs:
            try:
                self.transport.unlock_batch_mq(self.group, self.client_id, set(mqs))
            except (TransportError, BrokerResponseError) as exc:
                log.warning("%s: unlock at shutdown failed: %s", self.group, exc)
        try:
            self.transport.unregister_client(self.client_id, None, self.group)
        except (TransportError, BrokerResponseError) as exc:
            log.warning("%s: unregister failed: %s", self.group, exc)
        self.inner_producer.shutdown()
        self.transport.close()

    def kill(self) -> None:
        """Die like SIGKILL: no offset persist, no unregister, listener results ignored; the connection
        drops."""
        self._state = ServiceState.KILLED
        self.stopped = True
        self.scheduler.shutdown(wait=False)
        self.pull_queue.put(None)
        with self.pq_lock:
            for pq in self.process_queues.values():
                pq.dropped = True
        if self.consume_service is not None:
            self.consume_service.shutdown(wait=False)
        self.inner_producer.shutdown()
        self.transport.close()

    # -- broker callbacks -----------------------------------------------------------------------------------

    def notify_consumer_ids_changed(self, consumer_group: str) -> None:
        if consumer_group == self.group and not self.stopped:
            self.scheduler.schedule(0, self.rebalancer.rebalance_now, name="rebalance-on-notify")

    # -- heartbeat, offsets, locks --------------------------------------------------------------------------

    def consumer_data(self) -> ConsumerData:
        return ConsumerData(
            self.group,
            ConsumeType.CONSUME_PASSIVELY,
            self.message_model,
            self.consume_from_where,
            tuple(self.subscriptions.values()),
        )

    def send_heartbeat(self) -> None:
        if self.stopped:
            return
        try:
            self.transport.heartbeat(HeartbeatData(self.client_id, consumers=(self.consumer_data(),)), self)
        except (TransportError, BrokerResponseError) as exc:
            log.warning("%s: heartbeat failed: %s", self.group, exc)

    def persist_offsets(self) -> None:
        if self.stopped:
            return
        with self.pq_lock:
            mqs = list(self.process_queues)
        self.offset_store.persist_all(mqs)

    def send_message_back(self, msg: MessageExt, delay_level: int) -> bool:
        return try_send_back(self, msg, delay_level)

    def _clean_expired(self) -> None:
        svc = self.consume_service
        if not isinstance(svc, ConcurrentConsumeService):
            return
        with self.pq_lock:
            items = list(self.process_queues.items())
        for mq, pq in items:
            svc.clean_expired(pq, mq)

    def assigned_queues(self) -> list[MessageQueue]:
        with self.pq_lock:
            return sorted(self.process_queues)
