"""A synchronous send's retries: RocketMQ 4.9.8's ``DefaultMQProducerImpl.sendDefaultImpl`` policy, for a
single message (``Producer.send``) and a batch (``Producer.send_batch``) alike.

Why a module of its own: this policy decides which failures are tried again, on which queue and within
which time budget — the part of sending that an at-least-once reader needs to check against RocketMQ —
and it is independent of how one attempt is made (``call``) or of the producer's other send modes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from broker_sim.client.selectors import TopicPublishInfo
from broker_sim.clock import Clock
from broker_sim.common.errors import BrokerResponseError, RequestTimeoutError, SendFailedError, TransportError
from broker_sim.common.message import MessageQueue
from broker_sim.common.requests import SendMessageResponse

log = logging.getLogger("broker_sim.client.producer")

# Broker reply codes after which RocketMQ tries another queue (others are final: the message is bad).
#: Broker replies a sync send retries on another queue (``DefaultMQProducer.retryResponseCodes`` in 4.9.8:
#: TOPIC_NOT_EXIST, SERVICE_NOT_AVAILABLE, SYSTEM_ERROR, NO_PERMISSION, NO_BUYER_ID, NOT_IN_CURRENT_UNIT).
#: SYSTEM_BUSY (2) is not among them: a busy broker's refusal reaches the caller at once.
_RETRY_CODES = frozenset({17, 14, 1, 16, 204, 205})


class RetrySide(Protocol):
    """What the retries need of their producer: its clock and retry count, queue choice, fault bookkeeping
    and a fresh route."""

    retry_times_when_send_failed: int

    @property
    def clock(self) -> Clock: ...

    def _select(self, info: TopicPublishInfo, last_broker: str | None) -> MessageQueue: ...

    def _update_fault(self, mq: MessageQueue, begin_ms: int, *, isolation: bool) -> None: ...

    def publish_info(self, topic: str, *, refresh: bool = False) -> TopicPublishInfo: ...


def send_with_retries(
    side: RetrySide,
    topic: str,
    info: TopicPublishInfo,
    timeout: int,
    call: Callable[[MessageQueue, int], SendMessageResponse],
) -> tuple[MessageQueue, SendMessageResponse]:
    """RocketMQ 4.9.8's ``sendDefaultImpl``: up to ``1 + retry_times_when_send_failed`` attempts that
    share ONE ``timeout`` budget — each attempt gets what is left, and once it is spent the send fails
    with "call timeout" instead of trying again. So a send whose reply never comes (a lost ACK waits the
    whole budget) is not retried, while a refused or failed connection is retried at once. ``call(mq,
    ms_left)`` makes one attempt (a single message or a batch)."""
    attempts = 1 + max(0, side.retry_times_when_send_failed)
    last_broker: str | None = None
    last_exc: Exception | None = None
    first = side.clock.now_ms()
    waited = 0  # budget a timed-out attempt spent without the clock showing it (an in-process lost ACK)
    for attempt in range(attempts):
        cost = side.clock.now_ms() - first + waited
        if cost >= timeout:  # Java breaks on timeout < cost; a real timeout always overruns its budget
            raise SendFailedError(
                f"send to {topic} call timeout: {cost} ms of the {timeout} ms budget used "
                f"after {attempt} attempt(s): {last_exc}"
            ) from last_exc
        mq = side._select(info, last_broker)
        last_broker = mq.broker_name
        begin = side.clock.now_ms()
        try:
            resp = call(mq, timeout - cost)
        except BrokerResponseError as exc:
            side._update_fault(mq, begin, isolation=True)
            if exc.code not in _RETRY_CODES:
                raise SendFailedError(f"send to {mq} refused: {exc}") from exc
            last_exc = exc
        except RequestTimeoutError as exc:  # the message may be stored; the budget is spent
            side._update_fault(mq, begin, isolation=True)
            waited += max(0, timeout - cost - (side.clock.now_ms() - begin))
            last_exc = exc
        except TransportError as exc:
            side._update_fault(mq, begin, isolation=True)
            last_exc = exc
        else:
            side._update_fault(mq, begin, isolation=False)
            return mq, resp
        log.warning("send %s to %s failed (attempt %d/%d): %s", topic, mq, attempt + 1, attempts, last_exc)
        if attempt + 1 < attempts and isinstance(last_exc, BrokerResponseError):
            info = side.publish_info(topic, refresh=True)
    raise SendFailedError(f"send to {topic} failed after {attempts} attempts: {last_exc}") from last_exc
