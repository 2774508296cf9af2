"""A broker_sim transport wrapper that loses send ACKs and offset commits on command (chaos faults).

broker_sim's producers and consumers talk to the broker only through a ``BrokerTransport`` and accept a
ready transport in place of an address, so wrapping it is the least intrusive way to make the two
client-side faults happen to *one* process, over TCP as well as in-process:

* **lost send ACK** — the request reaches the broker and the message is stored, then the reply is thrown
  away and the caller gets broker_sim's ``RequestTimeoutError`` (exactly what a real network timeout after
  the store looks like). The broker_sim producer retries, which stores a second copy at a new offset.
* **lost offset commits** — ``UPDATE_CONSUMER_OFFSET`` requests are dropped and the COMMIT_OFFSET bit of
  pulls is cleared for a while, so the broker keeps an older committed offset and the next owner of the
  queue (after a kill or a rebalance) redelivers from there.

Every other request is passed through unchanged. The broker's answers to sends are counted by broker group
and status (a ``SYNC_MASTER`` whose slave is gone answers ``SLAVE_NOT_AVAILABLE``: stored, not replicated).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from typing import Any, cast

from broker_sim.broker.api import (
    PullMessageRequest,
    PullMessageResponse,
    ResponseCode,
    SendMessageRequest,
    SendMessageResponse,
)
from broker_sim.client.errors import RequestTimeoutError
from broker_sim.client.message import SysFlag
from broker_sim.client.transport import BrokerTransport, PullCallback, transport_for

log = logging.getLogger("reliable.demo.transport")


class ChaosTransport:
    """Delegates to ``inner`` and injects the two client-side faults when armed."""

    def __init__(self, inner: BrokerTransport) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._acks_to_lose = 0
        self._commits_lost_until = 0.0
        self.acks_lost = 0
        self.commits_dropped = 0
        #: answers the broker gave to sends, by broker group ("" = one broker) and status name (SUCCESS,
        #: SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT, …: the message is stored in each case)
        self.answers: Counter[tuple[str, str]] = Counter()

    @classmethod
    def wrap(cls, broker_or_address: object) -> ChaosTransport:
        return cls(transport_for(broker_or_address))

    def as_transport(self) -> BrokerTransport:
        """This object typed as the protocol it implements (by delegation)."""
        return cast(BrokerTransport, self)

    # --- arming --------------------------------------------------------------------------------------

    def lose_send_acks(self, count: int) -> None:
        with self._lock:
            self._acks_to_lose += count

    def lose_offset_commits(self, seconds: float) -> None:
        with self._lock:
            self._commits_lost_until = max(self._commits_lost_until, time.monotonic() + seconds)

    def _commits_lost(self) -> bool:
        with self._lock:
            return time.monotonic() < self._commits_lost_until

    # --- intercepted requests ------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return self._inner.address

    def send_message(
        self, request: SendMessageRequest, body: bytes, timeout_ms: int = 3000
    ) -> SendMessageResponse:
        response = self._inner.send_message(request, body, timeout_ms)
        with self._lock:
            self.answers[(request.broker_name, ResponseCode(response.code).name)] += 1
            lose = self._acks_to_lose > 0
            if lose:
                self._acks_to_lose -= 1
                self.acks_lost += 1
        if lose:
            where = f"{request.topic}:{response.queue_id}@{response.queue_offset}"
            log.warning("chaos: send ACK lost for %s", where)
            raise RequestTimeoutError(f"send ACK lost (chaos) for {where}")
        return response

    def answered(self) -> Counter[tuple[str, str]]:
        """A copy of :attr:`answers`."""
        with self._lock:
            return Counter(self.answers)

    def update_consumer_offset(
        self, consumer_group: str, topic: str, queue_id: int, offset: int, broker_name: str = ""
    ) -> None:
        if self._commits_lost():
            with self._lock:
                self.commits_dropped += 1
            return
        self._inner.update_consumer_offset(consumer_group, topic, queue_id, offset, broker_name)

    def _strip_commit(self, request: PullMessageRequest) -> PullMessageRequest:
        if request.sys_flag & SysFlag.PULL_COMMIT_OFFSET and self._commits_lost():
            with self._lock:
                self.commits_dropped += 1
            return dataclasses.replace(request, sys_flag=request.sys_flag & ~SysFlag.PULL_COMMIT_OFFSET)
        return request

    def pull_message(self, request: PullMessageRequest, timeout_ms: int = 30_000) -> PullMessageResponse:
        return self._inner.pull_message(self._strip_commit(request), timeout_ms)

    def pull_message_async(self, request: PullMessageRequest, callback: PullCallback) -> None:
        self._inner.pull_message_async(self._strip_commit(request), callback)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class SendWatch:
    """The producer's sends from now on, as the broker answered them: for the description of an outage and
    to wait until a group acknowledged some (a cluster fault waits for that before cutting a master)."""

    def __init__(self, transport: ChaosTransport) -> None:
        self.transport = transport
        self._before = transport.answered()

    def since(self) -> Counter[tuple[str, str]]:
        return self.transport.answered() - self._before

    def acked(self, group: str) -> int:
        """Sends to ``group`` answered SUCCESS since the watch began."""
        return self.since()[(group, ResponseCode.SUCCESS.name)]

    def describe(self) -> str:
        parts = [f"{group or 'broker'} {status} ×{n}" for (group, status), n in sorted(self.since().items())]
        return "sends answered meanwhile: " + (", ".join(parts) or "none")
