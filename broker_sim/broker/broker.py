"""The broker: request-level methods mirroring RocketMQ's processors, over one :class:`MessageStore`.

``Broker(store_dir, **config)`` → ``start()`` → requests → ``shutdown()`` (or ``crash()``). Each public
request method corresponds to one remoting request (code in brackets in its docstring), takes and returns the
types in :mod:`broker_sim.common.requests`, and raises :class:`~broker_sim.common.errors.BrokerResponseError`
subclasses carrying the wire response code, so the network server maps wire requests 1:1 onto these calls and
the in-process client transport calls them directly. Broker → client requests go through the
:class:`~broker_sim.common.requests.ClientChannel` each client registers with its heartbeat.

The request families live in services the broker owns (as RocketMQ's processors are): ``self.admin``
(:class:`~broker_sim.broker.admin.AdminService`), ``self.send_back``
(:class:`~broker_sim.broker.sendback.SendBackService`), ``self.pull_processor``, ``self.transactions``,
``self.client_manage`` (:class:`~broker_sim.broker.client_manage.ClientManageService`); the
Broker's methods of the same names delegate to them, so its public surface is unchanged.

The services are typed against :class:`~broker_sim.broker.context.BrokerContext` (what they may use of the
broker), not against ``Broker``, so they sit below it rather than in an import loop with it.

Timers (offset persistence, delayed delivery, long-poll timeouts, channel expiry, transaction check-back) all
run on ``self.scheduler`` over ``self.clock``; pass ``clock=ManualClock()`` to drive them from a test.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from broker_sim.broker.admin import AdminService
from broker_sim.broker.admin_clients import ClientAdminService
from broker_sim.broker.client_manage import ClientManageService
from broker_sim.broker.clients import ConsumerManager, ProducerManager, SubscriptionGroupManager
from broker_sim.broker.config import BrokerConfig, split_config
from broker_sim.broker.filtering import SubscriptionFilters
from broker_sim.broker.locks import RebalanceLockManager
from broker_sim.broker.offsets import ConsumerOffsetManager
from broker_sim.broker.pull import PullCallback, PullMessageProcessor
from broker_sim.broker.schedule import ScheduleMessageService
from broker_sim.broker.send import SendMessageService
from broker_sim.broker.sendback import SendBackService
from broker_sim.broker.topics import TopicConfig, TopicConfigManager
from broker_sim.broker.transaction import TransactionService
from broker_sim.clock import Clock
from broker_sim.common.errors import (
    RequestTimeoutError,
    ServiceNotAvailableError,
    TopicNotExistError,
)
from broker_sim.common.message import MessageQueue
from broker_sim.common.requests import (
    BrokerData,
    EndTransactionRequest,
    PullMessageRequest,
    PullMessageResponse,
    QueueData,
    TopicRouteData,
)
from broker_sim.common.scheduler import Scheduler
from broker_sim.common.service_state import ServiceState
from broker_sim.common.transport import BrokerTransport
from broker_sim.faults import FaultInjector
from broker_sim.store.message_store import MessageStore
from broker_sim.store.results import DispatchRequest

log = logging.getLogger("broker_sim.broker")


class Broker:
    def __init__(self, store_dir: str | Path, **config: Any) -> None:
        self.store_dir = Path(store_dir)
        self.config: BrokerConfig
        self.config, store_config = split_config(config)
        self.clock: Clock = self.config.clock
        self.log = log
        self.store = MessageStore(self.store_dir, store_config, self.clock)
        cdir = self.store.config_dir
        self.topics = TopicConfigManager(
            cdir / "topics.json",
            default_queue_nums=self.config.default_topic_queue_nums,
            auto_create_topic_enable=self.config.auto_create_topic_enable,
            schedule_levels=len(store_config.delay_levels_ms),
        )
        self.groups = SubscriptionGroupManager(
            cdir / "subscriptionGroup.json",
            auto_create=self.config.auto_create_subscription_group,
            default_retry_max_times=self.config.max_reconsume_times,
        )
        self.offsets = ConsumerOffsetManager(cdir / "consumerOffset.json")
        self.consumers = ConsumerManager(self.config.channel_expired_ms)
        self.producers = ProducerManager(self.config.channel_expired_ms)
        self.locks = RebalanceLockManager(self.clock.now_ms, self.config.rebalance_lock_max_live_ms)
        self.faults = FaultInjector(self.config.fault_seed, self.clock)
        self.scheduler = Scheduler(self.clock, f"broker-{self.config.broker_name}")
        self.filters = SubscriptionFilters(self.config.enable_property_filter)
        self.pull_processor = PullMessageProcessor(self)
        self.schedule_service: ScheduleMessageService | None = None
        self.transactions = TransactionService(self)
        self.sender = SendMessageService(self, self.transactions)
        self.send_message = self.sender.send_message
        self.send_batch_message = self.sender.send_batch_message
        self.ensure_topic_for_delivery = self.sender.ensure_topic_for_delivery
        self.admin = AdminService(
            self.store, self.topics, self.offsets, self.consumers, self.config, self.check_running
        )
        self.send_back = SendBackService(self.store, self.topics, self.groups, self.check_running)
        # Public request methods served by the composed services, under the names they always had.
        self.consumer_send_msg_back = self.send_back.consumer_send_msg_back
        a = self.admin
        self.create_topic = a.create_topic
        self.delete_topic = a.delete_topic
        self.topic_list = a.topic_list
        self.consumer_progress = a.consumer_progress
        self.view_message_by_id = a.view_message_by_id
        self.view_message_by_offset = a.view_message_by_offset
        self.query_message_by_key = a.query_message_by_key
        self.messages = a.messages
        self.retry_messages = a.retry_messages
        self.dlq_messages = a.dlq_messages
        self.persist_all = a.persist_all
        self.query_consume_queue = a.query_consume_queue
        self.client_manage = ClientManageService(self)
        m = self.client_manage
        self.heartbeat = m.heartbeat
        self.unregister_client = m.unregister_client
        self.client_channel_closed = m.client_channel_closed
        self.scan_not_active_channels = m.scan_not_active_channels
        self.check_client_config = m.check_client_config
        self.get_consumer_list_by_group = m.get_consumer_list_by_group
        self.client_admin = ClientAdminService(self)
        c = self.client_admin
        self.runtime_info = c.runtime_info
        self.update_subscription_group = c.update_subscription_group
        self.subscription_groups = c.subscription_groups
        self.topic_stats = c.topic_stats
        self.topic_consumed_by = c.topic_consumed_by
        self.consumer_connection = c.consumer_connection
        self.producer_connection = c.producer_connection
        self.reset_offset_by_time = c.reset_offset_by_time
        self.consumer_running_info = c.consumer_running_info
        self.consume_message_directly = c.consume_message_directly
        self._state: ServiceState = ServiceState.CREATED
        self._state_lock = threading.Lock()

    def client_transport(self) -> BrokerTransport:
        """The in-process transport a client built on this Broker uses (``Producer(broker, "P")``)."""
        from broker_sim.broker.in_process import InProcessTransport

        return InProcessTransport(self)

    def __repr__(self) -> str:
        return f"Broker({str(self.store_dir)!r}, {self.config.broker_name})"

    def __enter__(self) -> Broker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ================================================================================ life cycle

    def start(self) -> Broker:
        """Recover the store, load config tables, start timers. Returns self."""
        with self._state_lock:
            if self._state == ServiceState.RUNNING:
                return self
            if self._state != ServiceState.CREATED:
                raise ServiceNotAvailableError(f"broker is {self._state}; create a new Broker to restart")
            self.store.start()
            self.topics.load()
            self.groups.load()
            self.offsets.load()
            for name, queues in self.config.topics.items():
                if self.topics.select(name) is None:
                    self.topics.update(TopicConfig(name, queues, queues))
            self.topics.persist()
            self.schedule_service = ScheduleMessageService(self)
            self.schedule_service.load()
            self.store.add_dispatch_listener(self._on_dispatch)
            cfg = self.config
            self.scheduler.schedule_periodic(
                cfg.flush_consumer_offset_interval_ms, cfg.flush_consumer_offset_interval_ms,
                self.offsets.persist, name="persist-consumer-offsets",
            )  # fmt: skip
            self.scheduler.schedule_periodic(
                cfg.scan_not_active_channel_interval_ms, cfg.scan_not_active_channel_interval_ms,
                self.scan_not_active_channels, name="scan-channels",
            )  # fmt: skip
            if not self.store.replication.is_slave:  # a slave neither delivers delayed messages nor checks
                self.schedule_service.start()  # transactions: its master does (BrokerController)
                self.transactions.start()
            self._state = ServiceState.RUNNING
        log.info("broker %s started on %s (store %s)", cfg.broker_name, cfg.broker_addr, self.store_dir)
        return self

    def shutdown(self) -> None:
        """Clean stop: answer held pulls, persist offsets/delay progress/config, flush and close the store."""
        with self._state_lock:
            if self._state != ServiceState.RUNNING:
                self._state = ServiceState.SHUTDOWN
                return
            self._state = ServiceState.SHUTDOWN
        assert self.schedule_service is not None
        self.scheduler.shutdown()
        self.pull_processor.shutdown()
        self.offsets.persist()
        self.schedule_service.persist()
        self.topics.persist()
        self.groups.persist()
        self.store.shutdown()
        log.info("broker %s shut down", self.config.broker_name)

    def crash(self) -> None:
        """Power-cut: nothing persisted, unflushed commit-log data lost (ASYNC_FLUSH). Use via the
        injector."""
        with self._state_lock:
            if self._state != ServiceState.RUNNING:
                return
            self._state = ServiceState.CRASHED
        self.scheduler.shutdown(wait=False)
        self.store.crash()
        self.pull_processor.shutdown()

    @property
    def running(self) -> bool:
        return self._state == ServiceState.RUNNING

    def check_running(self) -> None:
        if self._state != ServiceState.RUNNING:
            raise ServiceNotAvailableError(f"broker {self.config.broker_name} is {self._state}")

    def _on_dispatch(self, req: DispatchRequest) -> None:
        self.pull_processor.on_dispatch(req)
        if self.schedule_service is not None:
            self.schedule_service.on_dispatch(req)

    # ================================================================================ routes

    def get_route_info_by_topic(self, topic: str) -> TopicRouteData:
        """GET_ROUTEINFO_BY_TOPIC (105, name server): TopicNotExistError (17) for an unknown topic."""
        self.check_running()
        tc = self.topics.select(topic)
        if tc is None:
            raise TopicNotExistError(f"No topic route info in name server for the topic: {topic}")
        cfg = self.config
        return TopicRouteData(
            [QueueData(cfg.broker_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag)],
            [BrokerData(cfg.cluster_name, cfg.broker_name, {0: cfg.broker_addr})],
        )

    # ================================================================================ pull

    def pull_message_async(self, req: PullMessageRequest, callback: PullCallback) -> None:
        """PULL_MESSAGE (11): ``callback`` gets exactly one reply, now or (held) later; request errors
        raise."""
        self.pull_processor.process(req, callback)

    def pull_message(self, req: PullMessageRequest, timeout_ms: int = 30_000) -> PullMessageResponse:
        """PULL_MESSAGE (11), blocking the caller until the (possibly held) reply."""
        done = threading.Event()
        box: list[PullMessageResponse | BaseException] = []

        def callback(r: PullMessageResponse | BaseException) -> None:
            box.append(r)
            done.set()

        self.pull_message_async(req, callback)
        if not self.clock.wait(done, timeout_ms / 1000):
            raise RequestTimeoutError(f"pull {req.topic}:{req.queue_id} not answered within {timeout_ms} ms")
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    # ================================================================================ offsets

    def query_consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """QUERY_CONSUMER_OFFSET (14); None means QUERY_NOT_FOUND (22).

        As ``ConsumerManageProcessor.queryConsumerOffset`` (4.9.8): a group with no committed offset gets 0
        while the queue still starts at 0 *and* its first message is still in memory; otherwise 22, and the
        client applies its CONSUME_FROM_* policy. ``query_offset_zero_for_new_group=False`` always answers
        22."""
        self.check_running()
        off = self.offsets.query_offset(group, topic, queue_id)
        if off >= 0:
            return off
        self.store.wait_dispatched(1.0)  # the answer depends on the consume queue (see get_max_offset)
        if (
            self.config.query_offset_zero_for_new_group
            and self.store.get_min_offset_in_queue(topic, queue_id) <= 0
            and not self.store.check_in_disk_by_consume_offset(topic, queue_id, 0)
        ):
            return 0
        return None

    def update_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """UPDATE_CONSUMER_OFFSET (15, oneway)."""
        self.check_running()
        self.commit_consumer_offset(group, topic, queue_id, offset)

    def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        if self.faults.drop_offset_commit(group, topic, queue_id, offset):
            return
        self.offsets.commit_offset(group, topic, queue_id, offset)

    def get_max_offset(self, topic: str, queue_id: int) -> int:
        """GET_MAX_OFFSET (30): the next offset to be written (0 for an unknown queue).

        Waits (at most 1 s) for the dispatcher to index what is already in the commit log: RocketMQ's reput
        service lags by about a millisecond, so a client that sends and then asks sees its messages; our
        dispatcher thread can lag further behind under load, and this hides that difference."""
        self.check_running()
        self.store.wait_dispatched(1.0)
        return self.store.get_max_offset_in_queue(topic, queue_id)

    def get_min_offset(self, topic: str, queue_id: int) -> int:
        """GET_MIN_OFFSET (31)."""
        self.check_running()
        return self.store.get_min_offset_in_queue(topic, queue_id)

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP (29)."""
        self.check_running()
        return self.store.get_offset_in_queue_by_time(topic, queue_id, timestamp_ms)

    def get_earliest_msg_store_time(self, topic: str, queue_id: int) -> int:
        """GET_EARLIEST_MSG_STORETIME (32)."""
        self.check_running()
        return self.store.get_earliest_message_time(topic, queue_id)

    # ================================================================================ transactions

    def end_transaction(self, req: EndTransactionRequest) -> None:
        """END_TRANSACTION (37, oneway): commit makes the half message visible; rollback drops it."""
        self.check_running()
        self.transactions.end(req)

    # ================================================================================ orderly locks

    def lock_batch_mq(self, group: str, client_id: str, mqs: set[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ (41): the subset of ``mqs`` now held by ``client_id`` (expires after 60 s idle)."""
        self.check_running()
        return self.locks.try_lock_batch(group, mqs, client_id)

    def unlock_batch_mq(self, group: str, client_id: str, mqs: set[MessageQueue]) -> None:
        """UNLOCK_BATCH_MQ (42)."""
        self.check_running()
        self.locks.unlock_batch(group, mqs, client_id)
