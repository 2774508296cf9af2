"""What a push consumer answers when an operator's tool reaches it through the broker (RocketMQ's
``ClientRemotingProcessor``): RESET_CONSUMER_CLIENT_OFFSET (220), GET_CONSUMER_RUNNING_INFO (307) and
CONSUME_MESSAGE_DIRECTLY (309).

A reset drops the consumer's process queues of the topic (results of listeners still running on them are
ignored, as after a rebalance), commits the new offsets to the broker and pulls again from them. Running info
reports the consumer's settings, subscriptions and per-queue state. Consuming directly runs the listener on
one message and reports the outcome without committing or sending anything back.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Protocol

from broker_sim.client.offset_store import ReadOffsetType
from broker_sim.common.errors import BrokerResponseError, MQClientError, TransportError
from broker_sim.common.message import ConsumeOrderlyStatus, ConsumeStatus, MessageExt, MessageQueue
from broker_sim.common.requests import ExpressionType

if TYPE_CHECKING:
    import threading

    from broker_sim.client.offset_store import OffsetStore
    from broker_sim.client.process_queue import ProcessQueue
    from broker_sim.client.rebalance import Rebalancer
    from broker_sim.common.requests import ConsumeFromWhere, MessageModel, SubscriptionData
    from broker_sim.common.transport import BrokerTransport

log = logging.getLogger(__name__)


class AdminHost(Protocol):
    """What the admin requests read of the push consumer they are answered for."""

    group: str
    client_id: str
    transport: BrokerTransport
    message_model: MessageModel
    consume_from_where: ConsumeFromWhere
    consume_threads: int
    pull_batch_size: int
    start_timestamp_ms: int
    subscriptions: dict[str, SubscriptionData]
    process_queues: dict[MessageQueue, ProcessQueue]
    pq_lock: threading.RLock
    offset_store: OffsetStore
    rebalancer: Rebalancer

    @property
    def is_running(self) -> bool: ...

    @property
    def orderly(self) -> bool: ...

    def listener_for_direct_consume(self) -> Callable[[list[MessageExt]], object]: ...


_RESULTS: dict[ConsumeStatus | ConsumeOrderlyStatus, str] = {
    ConsumeStatus.CONSUME_SUCCESS: "CR_SUCCESS",
    ConsumeStatus.RECONSUME_LATER: "CR_LATER",
    ConsumeOrderlyStatus.SUCCESS: "CR_SUCCESS",
    ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT: "CR_LATER",
}


class ConsumerAdmin:
    """Serves the three admin requests for one push consumer (``consumer.admin``), and checks its
    subscriptions with the broker at start."""

    def __init__(self, consumer: AdminHost) -> None:
        self.consumer = consumer

    def check_client_config(self) -> None:
        """As ``DefaultMQPushConsumerImpl.checkClientInBroker``: every non-TAG subscription is checked with
        the broker, so an unsupported or unparsable SQL92 expression fails ``start()`` loudly."""
        c = self.consumer
        for sub in c.subscriptions.values():
            if sub.expression_type is ExpressionType.TAG:
                continue
            try:
                c.transport.check_client_config(c.group, c.client_id, sub)
            except (TransportError, BrokerResponseError) as exc:
                raise MQClientError(
                    f"{c.group}: the broker refuses the {sub.expression_type} subscription "
                    f"{sub.sub_string!r} of {sub.topic}: {exc}"
                ) from exc

    def reset_offset(self, topic: str, group: str, offsets: dict[MessageQueue, int]) -> None:
        c = self.consumer
        if group != c.group or not c.is_running:
            return
        log.info("%s: offsets of %s reset by the broker: %s", c.group, topic, offsets)
        store = c.offset_store
        for mq, offset in offsets.items():
            store.update_offset(mq, offset, False)
            store.persist(mq)
        c.rebalancer.restart_queues(topic, offsets)

    def running_info(self) -> dict[str, Any]:
        """``ConsumerRunningInfo``: properties, subscriptions and one row per owned queue (as a list: Java's
        map keyed by MessageQueue objects is not plain JSON)."""
        c = self.consumer
        with c.pq_lock:
            queues = sorted(c.process_queues.items())
            rows = [
                {
                    "topic": mq.topic,
                    "brokerName": mq.broker_name,
                    "queueId": mq.queue_id,
                    "commitOffset": c.offset_store.read_offset(mq, ReadOffsetType.READ_FROM_MEMORY),
                    "cachedMsgCount": pq.msg_count,
                    "cachedMsgMaxOffset": pq.queue_offset_max,
                    "droped": pq.dropped,
                    "locked": pq.locked,
                    "lastPullTimestamp": pq.last_pull_ms,
                    "lastConsumeTimestamp": pq.last_consume_ms,
                }
                for mq, pq in queues
            ]
        return {
            "properties": {
                "consumerGroup": c.group,
                "clientId": c.client_id,
                "messageModel": c.message_model.name,
                "consumeFromWhere": c.consume_from_where.name,
                "consumeType": "CONSUME_PASSIVELY",
                "consumeOrderly": str(c.orderly).lower(),
                "consumeThreadMax": str(c.consume_threads),
                "pullBatchSize": str(c.pull_batch_size),
                "PROP_CONSUMER_START_TIMESTAMP": str(c.start_timestamp_ms),
            },
            "subscriptionSet": [
                {**asdict(s), "expression_type": str(s.expression_type)} for s in c.subscriptions.values()
            ],
            "mqTable": rows,
            "statusTable": {},
        }

    def consume_directly(self, message: MessageExt) -> dict[str, Any]:
        """``ConsumeMessageDirectlyResult`` of running the listener once on ``message``."""
        c = self.consumer
        listener = c.listener_for_direct_consume()
        begin = time.monotonic()
        result: dict[str, Any] = {"order": c.orderly, "autoCommit": True, "remark": ""}
        try:
            status = listener([message])
        except Exception as exc:
            result["consumeResult"] = "CR_THROW_EXCEPTION"
            result["remark"] = "".join(traceback.format_exception_only(exc)).strip()
        else:
            outcome = status if isinstance(status, ConsumeStatus | ConsumeOrderlyStatus) else None
            result["consumeResult"] = _RESULTS[outcome] if outcome is not None else "CR_RETURN_NULL"
        result["spentTimeMills"] = int((time.monotonic() - begin) * 1000)
        return result
