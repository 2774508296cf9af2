"""A push consumer's pull loop: one thread takes pull requests off the consumer's queue, long-polls the broker
for each (PULL_MESSAGE with the SUSPEND bit, 32 messages, the commit offset piggy-backed), hands what comes
back to the consume service and queues the next pull — RocketMQ's ``PullMessageService`` with
``DefaultMQPushConsumerImpl.pullMessage`` and its ``PullCallback``.

Why apart from :mod:`broker_sim.client.push_consumer`: flow control, the pull request and the handling of
each pull status are one request family with one loop of its own; the consumer keeps configuration, life
cycle, rebalancing and offsets, and owns the queue this loop reads (the rebalancer fills it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from broker_sim.client.offset_store import ReadOffsetType
from broker_sim.client.rebalance import PullRequest, Rebalancer
from broker_sim.common.message import SysFlag
from broker_sim.common.requests import MessageModel, PullMessageRequest, PullMessageResponse, PullStatus

if TYPE_CHECKING:
    import queue

    from broker_sim.client.consume_service import ConcurrentConsumeService, OrderlyConsumeService
    from broker_sim.client.offset_store import OffsetStore
    from broker_sim.client.pull_nodes import PullNodeTable
    from broker_sim.clock import Clock
    from broker_sim.common.requests import SubscriptionData
    from broker_sim.common.scheduler import Scheduler
    from broker_sim.common.transport import BrokerTransport

log = logging.getLogger("broker_sim.client.push_consumer")


class PullHost(Protocol):
    """What the pull loop reads and changes on the push consumer it pulls for."""

    group: str
    clock: Clock
    transport: BrokerTransport
    scheduler: Scheduler
    stopped: bool
    message_model: MessageModel
    subscriptions: dict[str, SubscriptionData]
    tag_filters: dict[str, frozenset[str] | None]
    offset_store: OffsetStore
    pull_queue: queue.Queue[PullRequest | None]
    pull_nodes: PullNodeTable
    consume_service: ConcurrentConsumeService | OrderlyConsumeService | None
    pull_batch_size: int
    pull_threshold_for_queue: int
    pull_threshold_size_for_queue: int
    consume_concurrently_max_span: int
    broker_suspend_max_time_ms: int
    pull_time_delay_ms_when_exception: int
    #: pulls held back by flow control (counted, logged every 1000th)
    flow_control_times: int
    rebalancer: Rebalancer

    @property
    def orderly(self) -> bool: ...


class PullService:
    """The pull loop of ``consumer`` (run it on its own thread; a ``None`` on the consumer's pull queue
    ends it)."""

    def __init__(self, consumer: PullHost) -> None:
        self.c = consumer

    def pull_later(self, pr: PullRequest, delay_ms: int) -> None:
        c = self.c
        if not c.stopped:
            c.scheduler.schedule(delay_ms, lambda: c.pull_queue.put(pr), name="pull-later")

    def run(self) -> None:
        c = self.c
        while True:
            pr = c.pull_queue.get()
            if pr is None or c.stopped:
                return
            try:
                self._pull(pr)
            except Exception:
                log.exception("%s: pull of %s failed", c.group, pr.mq)
                self.pull_later(pr, c.pull_time_delay_ms_when_exception)

    def _pull(self, pr: PullRequest) -> None:
        c = self.c
        pq = pr.pq
        if pq.dropped:
            return
        pq.last_pull_ms = c.clock.now_ms()
        if pq.msg_count > c.pull_threshold_for_queue or pq.msg_size_bytes > c.pull_threshold_size_for_queue:
            self._flow_control(pr, "count/size")
            return
        if not c.orderly and pq.max_span() > c.consume_concurrently_max_span:
            self._flow_control(pr, "span")
            return
        if c.orderly and c.message_model is MessageModel.CLUSTERING and not pq.locked:
            self.pull_later(pr, c.pull_time_delay_ms_when_exception)  # no broker lock: no pulling
            return
        sub = c.subscriptions.get(pr.mq.topic)
        if sub is None:
            self.pull_later(pr, c.pull_time_delay_ms_when_exception)
            return
        commit = 0
        if c.message_model is MessageModel.CLUSTERING:
            commit = max(0, c.offset_store.read_offset(pr.mq, ReadOffsetType.READ_FROM_MEMORY))
        sys_flag = (
            SysFlag.PULL_SUSPEND
            | SysFlag.PULL_SUBSCRIPTION
            | (SysFlag.PULL_COMMIT_OFFSET if commit > 0 else 0)
        )
        req = PullMessageRequest(
            c.group, pr.mq.topic, pr.mq.queue_id, pr.next_offset, c.pull_batch_size, sys_flag, commit,
            c.broker_suspend_max_time_ms, sub.sub_string, sub.sub_version, sub.expression_type,
            pr.mq.broker_name, c.pull_nodes.node(pr.mq),
        )  # fmt: skip
        c.transport.pull_message_async(req, lambda result: self._on_pull(pr, result))

    def _flow_control(self, pr: PullRequest, why: str) -> None:
        c = self.c
        c.flow_control_times += 1
        if c.flow_control_times % 1000 == 1:
            log.warning(
                "%s: flow control (%s) on %s: %d in flight, span %d",
                c.group,
                why,
                pr.mq,
                pr.pq.msg_count,
                pr.pq.max_span(),
            )
        self.pull_later(pr, 50)

    def _on_pull(self, pr: PullRequest, result: PullMessageResponse | BaseException) -> None:
        c = self.c
        if c.stopped:
            return
        try:
            self._process_result(pr, result)
        except Exception:
            # Never let one bad reply end this queue's pull loop: log it and pull again later.
            log.exception("%s: processing the pull result of %s failed", c.group, pr.mq)
            self.pull_later(pr, c.pull_time_delay_ms_when_exception)

    def _process_result(self, pr: PullRequest, result: PullMessageResponse | BaseException) -> None:
        c = self.c
        if isinstance(result, BaseException):
            log.warning("%s: pull of %s failed: %s", c.group, pr.mq, result)
            self.pull_later(pr, c.pull_time_delay_ms_when_exception)
            return
        c.pull_nodes.update(pr.mq, result.suggest_which_broker_id)
        status = result.status
        pr.next_offset = result.next_begin_offset
        if status is PullStatus.FOUND:
            tags = c.tag_filters.get(pr.mq.topic)
            msgs = [m for m in result.messages if tags is None or m.tags in tags]
            for m in msgs:
                m.broker_name = pr.mq.broker_name
            if msgs:
                dispatch = pr.pq.put_messages(msgs)
                assert c.consume_service is not None
                c.consume_service.submit(msgs, pr.pq, pr.mq, dispatch)
            elif pr.pq.msg_count == 0:
                c.offset_store.update_offset(pr.mq, pr.next_offset, True)
        elif status in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
            if pr.pq.msg_count == 0:  # correctTagsOffset: nothing in flight, so the pulled-to offset is safe
                c.offset_store.update_offset(pr.mq, pr.next_offset, True)
        else:
            # OFFSET_ILLEGAL (DefaultMQPushConsumerImpl): the queue's window is dropped, so messages still in
            # a listener commit nothing, and pulling goes on from the broker's offset with a new window. Java
            # waits 10 s and leaves the new window to the next rebalance; here it is made at once.
            log.warning("%s: offset of %s illegal, moving to %d", c.group, pr.mq, pr.next_offset)
            c.offset_store.update_offset(pr.mq, pr.next_offset, False)
            c.offset_store.persist(pr.mq)
            c.rebalancer.restart_queues(pr.mq.topic, {pr.mq: pr.next_offset})
            return
        c.pull_queue.put(pr)
